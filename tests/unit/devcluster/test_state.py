"""The state directory: a running cluster is protected, a stale one is cleared."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from gpuslice.devcluster.errors import DevClusterError
from gpuslice.devcluster.state import ClusterRecord, StateDir, group_alive, pid_alive


def _record(pid: int, components: dict[str, int] | None = None) -> ClusterRecord:
    return ClusterRecord(pid, "https://127.0.0.1:1", "/k", "v1.37.2", components or {})


def test_running_cluster_is_not_overwritten(tmp_path: Path) -> None:
    state = StateDir(tmp_path)
    state.write_record(_record(os.getpid()))
    with pytest.raises(DevClusterError, match=r"already running .*gpuslice dev-cluster down"):
        state.prepare_fresh()


def test_stale_state_is_cleared_and_its_processes_killed(tmp_path: Path) -> None:
    leftover = subprocess.Popen(["sleep", "300"], start_new_session=True)
    dead = subprocess.Popen(["true"])
    dead.wait()
    state = StateDir(tmp_path)
    state.write_record(_record(dead.pid, {"etcd": leftover.pid}))
    (tmp_path / "etcd").mkdir()
    (tmp_path / "etcd" / "member").write_text("old data")
    checkpoint = tmp_path / "nodes" / "gpu-node-1" / "agent" / "claims" / "uid.json"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_text("{}")

    note = state.prepare_fresh()

    assert note is not None
    assert "stale state" in note
    assert str(dead.pid) in note
    assert leftover.wait(timeout=5) != 0
    assert not (tmp_path / "etcd").exists()
    assert not (tmp_path / "nodes").exists(), "a fresh cluster's nodes start with no state of the old one's"
    assert state.read_record() is None
    assert (tmp_path / "pki").is_dir()


def test_garbage_record_is_explained(tmp_path: Path) -> None:
    (tmp_path / "cluster.json").write_text("{not json")
    with pytest.raises(DevClusterError, match="is not a dev cluster record"):
        StateDir(tmp_path).read_record()


def test_zombie_is_not_alive() -> None:
    child = subprocess.Popen(["true"])
    for _ in range(100):
        if not pid_alive(child.pid):
            break
        time.sleep(0.05)
    assert not pid_alive(child.pid)
    child.wait()


def test_group_is_alive_while_any_member_runs_and_not_as_zombies() -> None:
    leader = subprocess.Popen(["sh", "-c", "sleep 300 & wait"], start_new_session=True)
    try:
        assert group_alive(leader.pid)
        os.killpg(leader.pid, 9)
        for _ in range(100):  # the leader is our unreaped child: a zombie, which does not count
            if not group_alive(leader.pid):
                break
            time.sleep(0.05)
        assert not group_alive(leader.pid)
    finally:
        leader.wait()


def test_node_directories_of_a_deep_state_directory_fit_unix_socket_paths(tmp_path: Path) -> None:
    short = Path(tempfile.mkdtemp(prefix="s", dir="/tmp"))
    try:
        assert StateDir(short).node_dir("gpu-node-1") == short / "nodes" / "gpu-node-1"
    finally:
        shutil.rmtree(short)
    deep = StateDir(tmp_path / ("d" * 80))
    node = deep.node_dir("gpu-node-1")
    socket = node / "plugins_registry" / "gpu.gpuslice.dev-reg.sock"
    assert len(str(socket).encode()) <= 107
    assert (deep.root / "nodes" / "gpu-node-1").resolve() == node.resolve(), "found where exec-env looks"
    assert deep.node_dir("gpu-node-1") == node
    deep.prepare_fresh()
    assert not node.exists(), "a fresh cluster's nodes start empty"
    assert not (deep.root / "nodes").exists()
