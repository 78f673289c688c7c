"""The MPS control daemons' lifecycle (real processes): one per GPU and namespace, started once, stopped
by `quit`, started again when killed, adopted by the next agent, and none left over. Each lifecycle test
runs twice: on the fake backend's stand-in, and on NVIDIA's own ``nvidia-cuda-mps-control`` (Debian's
non-free ``nvidia-cuda-mps``, driver 535), which without a GPU starts, makes its pipe directory, answers
its control commands and quits as with one. The two differ where NVIDIA's does: it writes no pid file,
logs to stdout in the foreground (``daemon.out``), and leaves its sockets after ``quit``."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import types
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gpuslice.agent.gpus.fake import FakeBackend
from gpuslice.agent.mps.daemons import MpsDaemons, MpsError
from gpuslice.devcluster.nvidia_build import MPS_CONTROL, mps_binaries
from gpuslice.planning.node.mps import DaemonDirs, DaemonKey
from tests.unit.polling import eventually as until

GPU = "GPU-2d3e5f1a-0000-0000-0000-000000000001"
KEY = DaemonKey(GPU, "team-a")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state != "Z"


class NvidiasDaemon(FakeBackend):
    """Fake GPUs, NVIDIA's control daemon: as the NVML backend runs it (``-f``), without the launcher's
    mount namespace (its own test below)."""

    def mps_commands(self, shm: Path) -> tuple[list[str], list[str]]:
        control = str(mps_binaries() / MPS_CONTROL)
        return [control, "-f"], [control]


@pytest.fixture(params=["standin", "nvidia"])
def backend(request: pytest.FixtureRequest) -> FakeBackend:
    kind = NvidiasDaemon if request.param == "nvidia" else FakeBackend
    return kind("n1", [("h100-80gb", 2)])


def said(dirs: DaemonDirs) -> str:
    """What the daemon logged: the stand-in in control.log, NVIDIA's (in the foreground) on stdout."""
    return "".join(path.read_text() for path in (dirs.log / "control.log", dirs.log / "daemon.out") if path.exists())


def quit_logged(dirs: DaemonDirs) -> bool:
    return "Accepting command 'quit'" in said(dirs) or "Cmd:quit" in said(dirs)


def environment(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short directory: pytest's own are too deep for the sockets of a pipe directory in them."""
    path = Path(tempfile.mkdtemp(prefix="mps-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def daemons(short_dir: Path, backend: FakeBackend) -> AsyncIterator[MpsDaemons]:
    made = MpsDaemons("n1", backend, short_dir / "mps", short_dir / "shm")
    yield made
    for gpu in list(made.running):
        await made.release(gpu, lambda: False)


async def test_started_once_then_stopped_by_quit(daemons: MpsDaemons) -> None:
    dirs = await daemons.ensure(KEY)
    pid = daemons.pid(KEY)
    assert pid is not None
    assert alive(pid)
    assert (dirs.pipe / "control").exists()
    if isinstance(daemons.backend, NvidiasDaemon):
        assert not (dirs.pipe / "nvidia-cuda-mps-control.pid").exists(), "NVIDIA's 535 daemon writes none"
    else:
        await until(lambda: (dirs.pipe / "nvidia-cuda-mps-control.pid").exists())
    assert dirs.pipe.parent.parent.name == "gpu-2d3e5f1a", "short directories: the pipe's sockets fit a unix path"
    assert len(dirs.pipe.parent.name) == len("ns-") + 12, "the namespace's tag is short whatever its name"
    assert environment(pid)["CUDA_VISIBLE_DEVICES"] == GPU
    assert environment(pid)["CUDA_MPS_PIPE_DIRECTORY"] == str(dirs.pipe)
    assert environment(pid)["CUDA_MPS_LOG_DIRECTORY"] == str(dirs.log)
    await daemons.ensure(KEY)
    assert daemons.pid(KEY) == pid, "one daemon per GPU and namespace"

    await daemons.release(KEY, lambda: True)
    assert daemons.pid(KEY) == pid, "kept while a claim still needs it"
    await daemons.release(KEY, lambda: False)
    await until(lambda: not alive(pid))
    assert quit_logged(dirs), "stopped the documented way"
    assert not dirs.pipe.exists()
    assert not dirs.shm.exists()
    assert not (daemons.home(KEY) / "daemon.json").exists()


async def test_a_killed_daemon_is_started_again(daemons: MpsDaemons) -> None:
    restarts: list[str] = []

    async def told(gpu: str, message: str) -> None:
        restarts.append(message)

    daemons.on_restart = told
    await daemons.ensure(KEY)
    first = daemons.pid(KEY)
    assert first is not None
    os.kill(first, signal.SIGKILL)
    await until(lambda: daemons.pid(KEY) is None)
    await daemons.reconcile(lambda: {KEY})
    second = daemons.pid(KEY)
    assert second is not None
    assert second != first
    assert alive(second)
    assert restarts
    assert "was started again (it died)" in restarts[0]

    await daemons.reconcile(set)
    await until(lambda: not alive(second))
    assert daemons.running == {}, "no claim needs it: stopped"


async def test_the_next_agent_adopts_a_needed_daemon_and_stops_an_unneeded_one(short_dir: Path,
                                                                               backend: FakeBackend) -> None:
    other = DaemonKey("GPU-77777777-0000-0000-0000-000000000002", "team-a")
    first = MpsDaemons("n1", backend, short_dir / "mps", short_dir / "shm")
    await first.ensure(KEY)
    await first.ensure(other)
    kept, dropped = first.pid(KEY), first.pid(other)
    assert kept is not None
    assert dropped is not None

    # The agent is gone (its process handles with it); the daemons run on, in their own sessions.
    second = MpsDaemons("n1", backend, short_dir / "mps", short_dir / "shm")
    await second.adopt({KEY})
    assert second.pid(KEY) == kept, "adopted, not restarted under its clients"
    assert alive(kept)
    await until(lambda: not alive(dropped))
    assert second.pid(other) is None
    await second.release(KEY, lambda: False)
    await until(lambda: not alive(kept))
    await first.running[KEY].process.wait()  # type: ignore[union-attr]
    await first.running[other].process.wait()  # type: ignore[union-attr]


async def test_a_reused_pid_is_not_mistaken_for_the_daemon(daemons: MpsDaemons, short_dir: Path) -> None:
    await daemons.ensure(KEY)
    record = daemons.home(KEY) / "daemon.json"
    stranger = await asyncio.create_subprocess_exec(sys.executable, "-c", "import time; time.sleep(30)")
    try:
        record.write_text(f'{{"gpu": "{GPU}", "namespace": "team-a", "pid": {stranger.pid}, "started": "1"}}\n')
        fresh = MpsDaemons("n1", daemons.backend, daemons.root, daemons.shm_root)
        recorded = fresh._recorded(KEY)
        assert recorded is not None
        assert recorded.pid == stranger.pid
        assert not fresh._alive(recorded), "the same pid, another process: its start time differs"
    finally:
        stranger.kill()
        await stranger.wait()


async def test_a_daemon_that_cannot_start_says_why(short_dir: Path) -> None:
    class Broken(FakeBackend):
        def mps_commands(self, shm: Path) -> tuple[list[str], list[str]]:
            return [sys.executable, "-c", "import sys; print('no MPS here'); sys.exit(3)"], ["true"]

    daemons = MpsDaemons("n1", Broken("n1", [("h100-80gb", 1)]), short_dir / "mps", short_dir / "shm")
    with pytest.raises(MpsError, match=r"exited with 3; its output ends: no MPS here"):
        await daemons.ensure(KEY)


def test_launch_gives_the_daemon_its_gpus_shared_memory_as_dev_shm(short_dir: Path) -> None:
    """The launcher's private mount namespace: /dev/shm is the GPU's directory for the daemon only."""
    shm = short_dir / "shm"
    shm.mkdir()
    marker = f"gpuslice-test-{os.getpid()}"
    done = subprocess.run([sys.executable, "-m", "gpuslice.agent.mps.launch", str(shm), "sh", "-c",
                           f"touch /dev/shm/{marker}"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        assert "CAP_SYS_ADMIN" in done.stderr, done.stderr  # an unprivileged machine: it says what it needs
        return
    assert (shm / marker).exists()
    assert not Path(f"/dev/shm/{marker}").exists(), "the agent's own /dev/shm is untouched"


def test_the_nvml_backend_runs_the_drivers_daemon_in_the_foreground_with_its_shm_and_args(
        short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuslice.agent.gpus import GpuBackendError, nvml
    from gpuslice.agent.gpus.nvml import NvmlBackend

    loaded: list[Path] = []  # NVML's loading from the root is test_nvml's; here the root holds the binary
    monkeypatch.setattr(nvml, "load_nvml_from", loaded.append)

    driver = short_dir / "driver"
    (driver / "usr/bin").mkdir(parents=True)
    control = driver / "usr/bin/nvidia-cuda-mps-control"
    control.write_text("#!/bin/sh\n")
    control.chmod(0o755)
    backend = NvmlBackend(types.ModuleType("pynvml"), driver_root=driver, mps_args=("-M",))
    daemon, client = backend.mps_commands(short_dir / "shm")
    assert daemon == [sys.executable, "-m", "gpuslice.agent.mps.launch", str(short_dir / "shm"), str(control), "-f",
                      "-M"]
    assert client == [str(control)]
    with pytest.raises(GpuBackendError, match="nvidia-cuda-mps-control is not on PATH nor in"):
        NvmlBackend(types.ModuleType("pynvml"), driver_root=short_dir / "none").mps_commands(short_dir)
    assert loaded == [driver, short_dir / "none"], "one root for NVML and the MPS binaries"


async def test_a_daemon_that_died_with_its_agent_is_started_again_in_the_same_directories(
        short_dir: Path, backend: FakeBackend) -> None:
    """In a container the daemon ends with the agent's; the next agent starts a new one where the running
    clients' bind mounts point: the same directories, not new ones of the same name (NVIDIA's starts
    where its killed predecessor left its sockets and lock)."""
    first = MpsDaemons("n1", backend, short_dir / "mps", short_dir / "shm")
    dirs = await first.ensure(KEY)
    # What a client's container holds: the directory itself (a bind mount), not its name.
    mounted = os.open(dirs.pipe, os.O_RDONLY | os.O_DIRECTORY)
    old = first.pid(KEY)
    assert old is not None
    os.kill(old, signal.SIGKILL)
    await first.running[KEY].process.wait()  # type: ignore[union-attr]

    second = MpsDaemons("n1", backend, short_dir / "mps", short_dir / "shm")
    await second.adopt({KEY})
    new = second.pid(KEY)
    assert new is not None
    assert new != old
    try:
        await until(lambda: "control" in os.listdir(mounted))  # the clients' mounts see the new daemon
    finally:
        os.close(mounted)
    await second.release(KEY, lambda: False)


async def test_each_namespace_on_a_gpu_has_its_own_daemon_pipe_and_shared_memory(daemons: MpsDaemons) -> None:
    """The control socket takes quit from any client and /dev/shm is shared by a daemon's clients: so
    two tenants on one GPU never share a daemon. Stopping one leaves the other running."""
    other = DaemonKey(GPU, "team-b")
    mine, theirs = await daemons.ensure(KEY), await daemons.ensure(other)
    a, b = daemons.pid(KEY), daemons.pid(other)
    assert a is not None
    assert b is not None
    assert a != b
    assert {mine.pipe, mine.log, mine.shm}.isdisjoint({theirs.pipe, theirs.log, theirs.shm})
    assert not mine.shm.is_relative_to(theirs.shm)
    assert not theirs.shm.is_relative_to(mine.shm)
    assert environment(b)["CUDA_VISIBLE_DEVICES"] == GPU, "the same GPU"

    await daemons.release(KEY, lambda: False)
    await until(lambda: not alive(a))
    assert daemons.pid(other) == b, "the other namespace's daemon runs on"
    assert (theirs.pipe / "control").exists()
    assert theirs.shm.is_dir()


async def test_the_directories_of_another_namespaces_daemon_are_refused(monkeypatch: pytest.MonkeyPatch,
                                                                        daemons: MpsDaemons) -> None:
    """Two namespaces whose tags collide never share a daemon: the second is refused, saying why."""
    # monkeypatch first: undone after the daemons fixture stops the daemon by the tag it was started with
    # (the other way round, it looked for the daemon's pipe under the real tag and waited out its quit).
    monkeypatch.setattr("gpuslice.agent.mps.daemons.namespace_tag", lambda namespace: "ns-same")
    await daemons.ensure(KEY)
    with pytest.raises(MpsError, match="are those of namespace team-a's daemon"):
        await daemons.ensure(DaemonKey(GPU, "team-b"))
    fresh = MpsDaemons("n1", daemons.backend, daemons.root, daemons.shm_root)  # the record says it too
    with pytest.raises(MpsError, match="are those of namespace team-a's daemon"):
        await fresh.ensure(DaemonKey(GPU, "team-b"))


async def test_a_pipe_directory_too_long_for_its_sockets_is_refused_with_the_fix(short_dir: Path) -> None:
    daemons = MpsDaemons("n1", FakeBackend("n1", [("h100-80gb", 1)]), short_dir / ("d" * 80), short_dir / "shm")
    with pytest.raises(MpsError, match=r"too long for the sockets .* give the agent a shorter --mps-dir"):
        await daemons.ensure(KEY)
    assert daemons.running == {}
