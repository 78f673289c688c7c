"""Component processes: early exits and hangs are reported with their log; stop leaves nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuslice.devcluster.errors import DevClusterError
from gpuslice.devcluster.process import Component
from gpuslice.devcluster.state import pid_alive
from tests.unit.polling import eventually


async def _never_healthy() -> bool:
    return False


async def test_component_that_exits_early_reports_code_and_log(tmp_path: Path) -> None:
    component = Component(
        "etcd", ["/bin/sh", "-c", "echo 'listen tcp 127.0.0.1:2379: bind: address already in use'; exit 3"],
        tmp_path / "etcd.log", _never_healthy,
    )
    await component.start()
    with pytest.raises(DevClusterError) as raised:
        await component.wait_healthy()
    text = str(raised.value)
    assert "etcd exited with code 3 while starting" in text
    assert "address already in use" in text
    assert str(tmp_path / "etcd.log") in text


async def test_component_that_never_gets_healthy_times_out(tmp_path: Path) -> None:
    component = Component(
        "kube-apiserver", ["/bin/sh", "-c", "echo waiting; sleep 30"], tmp_path / "a.log",
        _never_healthy, startup_timeout=0.5,
    )
    await component.start()
    try:
        with pytest.raises(DevClusterError, match="did not become healthy within 0 s"):
            await component.wait_healthy()
    finally:
        await component.stop()


async def test_stop_kills_the_whole_process_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    # The shell ignores SIGTERM and leaves a grandchild behind; stop must get both.
    script = f"trap '' TERM; sleep 300 & echo $! > {pid_file}; wait"
    component = Component("stubborn", ["/bin/sh", "-c", script], tmp_path / "s.log", startup_timeout=5)
    await component.start()
    await component.wait_healthy()
    await eventually(lambda: pid_file.exists() and pid_file.read_text().strip(), 5, what="the grandchild's pid")
    grandchild = int(pid_file.read_text())
    assert pid_alive(grandchild)
    await component.stop(grace=0.5)
    assert not component.running
    # The group's SIGKILL is sent before stop returns; the grandchild's exit follows it, at once
    # when idle and a moment later on a loaded machine.
    await eventually(lambda: not pid_alive(grandchild), 2.5, what="the grandchild to exit")
    assert not pid_alive(grandchild)


async def test_missing_binary_fails_clearly(tmp_path: Path) -> None:
    component = Component("kube-scheduler", [str(tmp_path / "missing")], tmp_path / "x.log")
    with pytest.raises(DevClusterError, match=r"Could not start kube-scheduler .*make kube-bin"):
        await component.start()
    assert not component.running
