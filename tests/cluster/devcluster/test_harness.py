"""Test 5: the harness itself, as a user drives it: up, down, nothing left; clear failures."""

from __future__ import annotations

import asyncio
import socket
import sys
from pathlib import Path

import pytest

from gpuslice.devcluster import binaries
from gpuslice.devcluster.cluster import ClusterSpec, DevCluster
from gpuslice.devcluster.errors import DevClusterError
from gpuslice.kube.client import KubeClient
from tests.cluster.devcluster.processes import gpuslice, processes_using
from tests.cluster.kubeutil import wait_for


async def test_detached_up_and_down_leave_nothing_running(tmp_path: Path) -> None:
    state = tmp_path / "state"
    started = await asyncio.to_thread(gpuslice, "dev-cluster", "up", "--detach", "--nodes", "1", "--state-dir", str(state))
    try:
        assert started.returncode == 0, started.stderr
        kubeconfig = Path(started.stdout.strip())
        assert kubeconfig == state / "kubeconfig"
        assert "dev-cluster: up." in started.stderr

        printed = await asyncio.to_thread(gpuslice, "dev-cluster", "kubeconfig", "--state-dir", str(state))
        assert printed.stdout.strip() == str(kubeconfig)

        async with await KubeClient.from_kubeconfig(kubeconfig) as kube:
            assert [n["metadata"]["name"] for n in await kube.list("/api/v1/nodes")] == ["gpu-node-1"]
            # gpuslice is installed and its controller runs: a policy gets its DeviceClass.
            await kube.create("/apis/gpuslice.dev/v1alpha1/gpuslicepolicies", {
                "apiVersion": "gpuslice.dev/v1alpha1", "kind": "GpuSlicePolicy", "metadata": {"name": "smoke"},
                "spec": {"slicing": {"mode": "memory", "sliceSize": "10Gi"}},
            })

            async def device_class() -> bool:
                classes = await kube.list("/apis/resource.k8s.io/v1/deviceclasses")
                return any(c["metadata"]["name"] == "smoke.gpuslice.dev" for c in classes)

            await wait_for(device_class, what="the dev cluster's controller to reconcile a policy")
        # etcd, apiserver, scheduler, controller-manager, gpuslice controller
        assert len(processes_using(state)) >= 5, processes_using(state)

        again = await asyncio.to_thread(gpuslice, "dev-cluster", "up", "--detach", "--state-dir", str(state))
        assert again.returncode == 1
        assert "already running" in again.stderr
    finally:
        stopped = await asyncio.to_thread(gpuslice, "dev-cluster", "down", "--state-dir", str(state))
    assert stopped.returncode == 0, stopped.stderr
    assert "nothing left running" in stopped.stderr
    assert processes_using(state) == []
    gone = await asyncio.to_thread(gpuslice, "dev-cluster", "kubeconfig", "--state-dir", str(state))
    assert gone.returncode == 1
    assert "No dev cluster is running" in gone.stderr


async def test_bad_binary_path_fails_with_a_clear_message(tmp_path: Path) -> None:
    result = await asyncio.to_thread(
        gpuslice, "dev-cluster", "up", "--state-dir", str(tmp_path / "state"),
        env={"TEST_ASSET_KUBE_APISERVER": str(tmp_path / "no-such-apiserver")},
    )
    assert result.returncode == 1
    assert "kube-apiserver binary" in result.stderr
    assert str(tmp_path / "no-such-apiserver") in result.stderr
    assert "Traceback" not in result.stderr
    assert processes_using(tmp_path) == []


async def test_component_that_exits_early_is_reported_and_the_rest_stopped(tmp_path: Path) -> None:
    found = await binaries.resolve(build_if_missing=False)
    # A real failure: the scheduler binary refuses the controller-manager's flags.
    wrong = binaries.Binaries({**found.paths, "kube-controller-manager": found["kube-scheduler"]}, found.origins)
    cluster = DevCluster(ClusterSpec(tmp_path / "state", nodes=1), binaries=wrong)
    with pytest.raises(DevClusterError) as failed:
        await cluster.start()
    message = str(failed.value)
    assert "kube-controller-manager exited with code 1 while starting" in message
    assert "unknown flag" in message  # the tail of the component's own log
    assert processes_using(tmp_path) == []


async def test_port_in_use_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cluster = DevCluster(ClusterSpec(tmp_path / "state", apiserver_port=port))
        with pytest.raises(DevClusterError, match=f"Port {port} on 127.0.0.1.*already in use"):
            await cluster.start()
    assert processes_using(tmp_path) == []


async def test_stale_state_directory_is_cleared_and_reused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    dead = await asyncio.create_subprocess_exec("true")
    await dead.wait()
    (state / "cluster.json").write_text(
        f'{{"supervisor_pid": {dead.pid}, "server": "https://127.0.0.1:1", "kubeconfig": "x",'
        ' "kubernetes_version": "v1.37.2", "components": {}, "nodes": []}'
    )
    notes: list[str] = []
    found = await binaries.resolve(build_if_missing=False)
    async with DevCluster(ClusterSpec(state, nodes=0), binaries=found, report=notes.append) as cluster:
        kube = await KubeClient.from_kubeconfig(cluster.kubeconfig)
        async with kube:
            assert (await kube.get("/version"))["gitVersion"] == cluster.kubernetes_version
    assert any("stale state" in note for note in notes)
    assert processes_using(tmp_path) == []


async def test_supervisor_killed_hard_leaves_nothing_behind(tmp_path: Path) -> None:
    """Components die with their supervisor (PR_SET_PDEATHSIG), even on SIGKILL."""
    state = tmp_path / "state"
    supervisor = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpuslice", "dev-cluster", "up", "--nodes", "1", "--state-dir", str(state),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )
    assert supervisor.stdout is not None
    kubeconfig = (await asyncio.wait_for(supervisor.stdout.readline(), 120)).decode().strip()
    assert kubeconfig == str(state / "kubeconfig")
    assert len(processes_using(state)) >= 5
    supervisor.kill()
    await supervisor.wait()

    async def all_gone() -> bool:
        return processes_using(state) == []

    try:
        await wait_for(all_gone, within=30, what="every component to exit with its supervisor")
    except AssertionError as error:
        raise AssertionError(f"{error}; still running: {processes_using(state)}") from None


def test_agent_without_a_gpu_driver_says_so(tmp_path: Path) -> None:
    result = gpuslice("agent", "--node", "n1", "--backend", "nvml", "--kubeconfig", str(tmp_path / "none"))
    assert result.returncode == 1
    assert "agent: NVML could not start" in result.stderr
    assert "--backend fake" in result.stderr
    assert "Traceback" not in result.stderr
