"""Running a dev cluster for a user: in the foreground until Ctrl-C, or detached.

A detached cluster is the same foreground supervisor started in its own
session, with its output in ``supervisor.log``; ``down`` signals it and it
stops its components as on Ctrl-C. Components die with the supervisor
(``PR_SET_PDEATHSIG``), so even a supervisor killed hard leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

from gpuslice.devcluster.cluster import ClusterSpec, DevCluster, stderr_reporter
from gpuslice.devcluster.errors import DevClusterError
from gpuslice.devcluster.process import log_tail
from gpuslice.devcluster.state import ClusterRecord, StateDir, group_alive, pid_alive

DETACH_TIMEOUT = 20 * 60.0  # a cold build of the binaries can happen first


def _announce(cluster: DevCluster) -> None:
    stderr_reporter(
        f"dev-cluster: up. API server {cluster.server}, Kubernetes {cluster.kubernetes_version},"
        f" nodes: {', '.join(cluster.node_names) or 'none'}.\n"
        f"dev-cluster: export KUBECONFIG={cluster.kubeconfig}"
    )
    print(cluster.kubeconfig, flush=True)


async def run_foreground(spec: ClusterSpec) -> int:
    """Run until SIGINT/SIGTERM or until a component dies; 0 on a clean stop."""
    cluster = DevCluster(spec, report=stderr_reporter)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    starting = asyncio.create_task(cluster.start())
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():
        stderr_reporter("dev-cluster: interrupted while starting; stopping what was started")
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError, DevClusterError):
            await starting
        return 130
    stopping.cancel()
    if (error := starting.exception()) is not None:
        if isinstance(error, DevClusterError):
            stderr_reporter(f"dev-cluster: {error}")
            return 1
        raise error
    _announce(cluster)
    code = 0
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)
        if (dead := cluster.dead_component()) is not None:
            code = 1
            stderr_reporter(f"dev-cluster: {dead.failure('stopped unexpectedly')}")
            break
    stderr_reporter("dev-cluster: stopping")
    await cluster.stop()
    stderr_reporter("dev-cluster: stopped; nothing left running")
    return code


def start_detached(spec: ClusterSpec, argv: Sequence[str]) -> int:
    """Start a supervisor in its own session and wait until its cluster is up."""
    state = StateDir(spec.state_dir)
    if (running := state.running_record()) is not None:
        stderr_reporter(
            f"dev-cluster: already running from {state.root} (pid {running.supervisor_pid})."
            f" Stop it with: gpuslice dev-cluster down --state-dir {state.root}"
        )
        return 1
    state.root.mkdir(parents=True, exist_ok=True)
    log_path = state.root / "supervisor.log"
    with open(log_path, "wb") as log:
        child = subprocess.Popen(
            [sys.executable, "-m", "gpuslice", *argv],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
        )
    shown = 0
    deadline = time.monotonic() + DETACH_TIMEOUT
    while time.monotonic() < deadline:
        text = log_path.read_text(errors="replace")
        lines = [ln for ln in text.splitlines() if ln.startswith(("dev-cluster:", "kube-bin:"))]
        for line in lines[shown:]:
            stderr_reporter(line)
        shown = len(lines)
        record = state.read_record()
        if record is not None and record.supervisor_pid == child.pid:
            stderr_reporter(f"dev-cluster: detached (supervisor pid {child.pid}, log {log_path})")
            print(record.kubeconfig, flush=True)
            return 0
        if child.poll() is not None:
            stderr_reporter(
                f"dev-cluster: failed to start; supervisor output ({log_path}):\n"
                + log_tail(log_path, 40)
            )
            return 1
        time.sleep(0.5)
    child.terminate()
    stderr_reporter(f"dev-cluster: not up after {DETACH_TIMEOUT:.0f} s; see {log_path}")
    return 1


def stop_detached(state: StateDir, timeout: float = 60.0) -> str:
    """Stop the cluster recorded in ``state``; say what was done."""
    record: ClusterRecord | None = state.read_record()
    if record is None:
        return f"No dev cluster is running from {state.root}; nothing to stop."
    if pid_alive(record.supervisor_pid):
        os.kill(record.supervisor_pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while pid_alive(record.supervisor_pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if pid_alive(record.supervisor_pid):
            os.kill(record.supervisor_pid, signal.SIGKILL)
    for pid in record.components.values():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    # SIGKILL is delivered, not finished: say "nothing left" only once the groups are gone.
    deadline = time.monotonic() + 10
    while any(group_alive(pid) for pid in record.components.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    state.remove_record()
    return f"Stopped the dev cluster in {state.root}; nothing left running."

