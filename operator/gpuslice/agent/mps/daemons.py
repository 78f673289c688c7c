"""One MPS control daemon per GPU and tenant namespace with MPS devices prepared, supervised by the agent.

A daemon's pipe directory holds its control socket, which any client can send ``quit``,
``terminate_client`` or ``set_*``, and its shared-memory directory is its clients' ``/dev/shm``:
so a daemon serves the claims of one namespace only, never two tenants (NVIDIA's DRA driver
likewise runs one per claim). Several daemons on one GPU each start their own MPS server, and the
GPU time-slices between servers: that is the cost; the clients of one namespace share a server
and run concurrently.

Which (GPU, namespace) pairs need one is what the claim checkpoints say (a device prepared with
``mps``, and the claim's namespace), never what is in memory: a daemon is started before the
first such claim's CDI spec is written (prepare), stopped once the last such claim is unprepared,
started again when it dies (the supervision loop, with backoff), and at the agent's start matched
against the checkpoints that survived: a daemon that is still needed is adopted, any other is
stopped, a missing one is started before the kubelet plugin registers.

Each daemon gets its own directories (``<mps dir>/<gpu tag>/<namespace tag>/pipe`` and ``log``,
and ``<mps shm dir>/<gpu tag>/<namespace tag>``, with the tags of ``planning.devices.gpu_tag`` and
``planning.node.mps.namespace_tag``: short and of fixed length, so the sockets in the pipe directory
stay within a unix socket path's 107 bytes whatever the namespace's name; its record names the
namespace, and a tag that some other namespace's daemon holds is refused, never shared),
``CUDA_VISIBLE_DEVICES`` set to its GPU's UUID (so its clients see that GPU alone, as device
0), and its own session: an agent that dies (SIGKILL, OOM) does not take
it along, so running clients keep their daemon and the next agent adopts it. A record of what was
started (``daemon.json``: pid and the kernel's start time of that pid) is how it is recognised
later, whatever reused its pid. Inside a container the daemon still ends with the container (its
PID namespace goes with the agent): the restarted agent starts it again during recovery, before
it registers, and clients that were connected must reconnect.

The command is the backend's (``GpuBackend.mps_commands``): ``nvidia-cuda-mps-control -f`` from
the node's driver on NVIDIA nodes (through ``launch``, for ``/dev/shm``), ``standin`` on fake ones.
Stopping it is what its documentation says: ``quit`` on its control client; SIGTERM, then SIGKILL,
if it does not end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import structlog
from prometheus_client import Counter, Gauge

from gpuslice.agent.gpus import GpuBackend, GpuBackendError
from gpuslice.backoff import Backoff
from gpuslice.errors import GpusliceError
from gpuslice.planning.devices import gpu_tag
from gpuslice.planning.node.mps import DaemonDirs, DaemonKey, namespace_tag

log = structlog.get_logger(__name__)
RECORD = "daemon.json"
READY_FILES = ("nvidia-cuda-mps-control.pid", "control")
# Room for the names of the sockets in a pipe directory: the daemon's "control" and the others it
# and its servers make there, with some to spare.
SOCKET_NAME_ROOM = 20
RESTART_BACKOFF = Backoff(2.0, 60.0)  # a daemon that keeps failing to start is tried again less often
MAX_SOCKET_PATH = 107  # sizeof(sockaddr_un.sun_path) - 1 on Linux
DAEMONS = Gauge("gpuslice_agent_mps_daemons", "MPS control daemons the agent runs (one per GPU and tenant"
                " namespace with MPS devices prepared).", ["node"])
RESTARTS = Counter("gpuslice_agent_mps_daemon_restarts_total", "MPS control daemons the agent found dead and"
                   " started again (their clients had to reconnect).", ["node", "gpu", "namespace"])


class MpsError(GpusliceError):
    """An MPS control daemon could not be started; the message says why."""


@dataclass
class Running:
    pid: int
    started: str  # the kernel's start time of the pid (field 22 of /proc/<pid>/stat)
    process: asyncio.subprocess.Process | None = None  # ours; None when adopted from an earlier agent


@dataclass
class _Retry:
    failures: int = 0
    next_try: float = 0.0


@dataclass
class MpsDaemons:
    node: str
    backend: GpuBackend
    root: Path  # <mps dir>: per GPU, a directory per namespace with pipe/, log/ and the record
    shm_root: Path  # <mps shm dir>: per GPU, a shared-memory directory per namespace
    proc: Path = Path("/proc")  # the agent's own: its daemons are in its PID namespace
    ready_timeout: float = 15.0
    stop_timeout: float = 5.0
    on_restart: Callable[[str, str], Awaitable[None]] | None = None  # (gpu, message): a Node Event
    running: dict[DaemonKey, Running] = field(default_factory=dict)
    _locks: dict[DaemonKey, asyncio.Lock] = field(default_factory=dict)
    _retry: dict[DaemonKey, _Retry] = field(default_factory=dict)

    def dirs(self, key: DaemonKey) -> DaemonDirs:
        home = self.home(key)
        return DaemonDirs(home / "pipe", home / "log", self.shm_root / gpu_tag(key.gpu) / namespace_tag(key.namespace))

    def home(self, key: DaemonKey) -> Path:
        return self.root / gpu_tag(key.gpu) / namespace_tag(key.namespace)

    def lock(self, key: DaemonKey) -> asyncio.Lock:
        return self._locks.setdefault(key, asyncio.Lock())

    def pid(self, key: DaemonKey) -> int | None:
        running = self.running.get(key)
        return running.pid if running is not None and self._alive(running) else None

    # Starting and stopping

    async def ensure(self, key: DaemonKey) -> DaemonDirs:
        """The daemon of the namespace on the GPU, started if it is not running; its directories."""
        async with self.lock(key):
            running = self.running.get(key)
            if running is None or not self._alive(running):
                await self._start(key)
            return self.dirs(key)

    async def release(self, key: DaemonKey, still_needed: Callable[[], bool]) -> None:
        """Stop the daemon unless ``still_needed()`` (asked under its lock, so a prepare that wrote
        its checkpoint first keeps it)."""
        async with self.lock(key):
            if not still_needed():
                await self._stop(key)

    def _check_dirs(self, key: DaemonKey, dirs: DaemonDirs) -> None:
        """Refuse directories another namespace's daemon holds (the same tag: a hash collision) and a
        pipe directory too long for the sockets in it."""
        holder = _record_key(self.home(key) / RECORD)
        other = next((k for k in self.running if k != key and self.home(k) == self.home(key)), None) or (
            holder if holder != key else None)
        if other is not None:
            raise MpsError(f"the MPS directories {self.home(key)} of namespace {key.namespace} on GPU {key.gpu} are"
                           f" those of namespace {other.namespace}'s daemon (their tags collide); a daemon is never"
                           " shared across namespaces, so this namespace's MPS claims on this GPU wait until that"
                           " daemon is stopped")
        longest = len(os.fsencode(dirs.pipe)) + 1 + SOCKET_NAME_ROOM
        if longest > MAX_SOCKET_PATH:
            raise MpsError(f"the MPS pipe directory {dirs.pipe} is too long for the sockets the daemon makes in it"
                           f" ({longest} of a unix socket path's {MAX_SOCKET_PATH} bytes); give the agent a"
                           " shorter --mps-dir")

    async def _start(self, key: DaemonKey) -> None:
        dirs = self.dirs(key)
        self._check_dirs(key, dirs)
        for directory in (dirs.pipe, dirs.log, dirs.shm):
            directory.mkdir(parents=True, exist_ok=True)
            directory.chmod(0o755 if directory != dirs.shm else 0o1777)  # clients of any user
        for leftover in READY_FILES:
            (dirs.pipe / leftover).unlink(missing_ok=True)
        try:
            daemon, _ = self.backend.mps_commands(dirs.shm)
        except GpuBackendError as error:
            raise MpsError(str(error)) from error
        env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_")}
        env.update({"CUDA_VISIBLE_DEVICES": key.gpu, "CUDA_MPS_PIPE_DIRECTORY": str(dirs.pipe),
                    "CUDA_MPS_LOG_DIRECTORY": str(dirs.log)})
        with (dirs.log / "daemon.out").open("ab") as out:
            try:
                process = await asyncio.create_subprocess_exec(
                    *daemon, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out,
                    start_new_session=True)
            except OSError as error:
                raise MpsError(f"{daemon[0]} could not be run ({error})") from error
        running = Running(process.pid, self._start_time(process.pid) or "", process)
        deadline = time.monotonic() + self.ready_timeout
        while not any((dirs.pipe / f).exists() for f in READY_FILES):
            if process.returncode is not None or time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
                tail = _tail(dirs.log / "daemon.out") or _tail(dirs.log / "control.log")
                why = f"exited with {process.returncode}" if time.monotonic() <= deadline else \
                    f"was not ready within {self.ready_timeout:.0f} s"
                raise MpsError(f"the MPS control daemon of namespace {key.namespace} on GPU {key.gpu}"
                               f" ({' '.join(daemon)}) {why}"
                               + (f"; its output ends: {tail}" if tail else ""))
            await asyncio.sleep(0.05)
        self.running[key] = running
        _write_record(self.home(key) / RECORD, key, running)
        DAEMONS.labels(self.node).set(len(self.running))
        log.info("MPS control daemon started", node=self.node, gpu=key.gpu, namespace=key.namespace, pid=process.pid,
                 pipe=str(dirs.pipe))

    async def _stop(self, key: DaemonKey) -> None:
        running = self.running.pop(key, None) or self._recorded(key)
        dirs = self.dirs(key)
        if running is not None and self._alive(running):
            await self._quit(key, dirs)
            if not await self._ended(running, self.stop_timeout):
                log.warning("the MPS control daemon did not quit; terminating it", node=self.node, gpu=key.gpu,
                            namespace=key.namespace, pid=running.pid)
                self._signal(running, signal.SIGTERM)
                if not await self._ended(running, self.stop_timeout):
                    self._signal(running, signal.SIGKILL)
                    await self._ended(running, self.stop_timeout)
            log.info("MPS control daemon stopped", node=self.node, gpu=key.gpu, namespace=key.namespace,
                     pid=running.pid)
        (self.home(key) / RECORD).unlink(missing_ok=True)
        for directory in (dirs.pipe, dirs.shm):  # the log stays, for whoever wants to read it
            shutil.rmtree(directory, ignore_errors=True)
        with contextlib.suppress(OSError):  # the GPU's shm directory, once its last namespace's is gone
            dirs.shm.parent.rmdir()
        DAEMONS.labels(self.node).set(len(self.running))

    async def _quit(self, key: DaemonKey, dirs: DaemonDirs) -> None:
        try:
            _, client = self.backend.mps_commands(dirs.shm)
            env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(dirs.pipe), "CUDA_MPS_LOG_DIRECTORY": str(dirs.log)}
            process = await asyncio.create_subprocess_exec(
                *client, env=env, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL)
            async with asyncio.timeout(self.stop_timeout):
                await process.communicate(b"quit\n")
        except (GpuBackendError, OSError, TimeoutError) as error:
            log.warning("could not ask the MPS control daemon to quit", node=self.node, gpu=key.gpu,
                        namespace=key.namespace, error=str(error))

    # Supervision

    async def adopt(self, needed: Iterable[DaemonKey]) -> None:
        """At start: daemons an earlier agent left are adopted where still needed, stopped everywhere
        else; a (GPU, namespace) that needs one and has none gets one."""
        wanted = set(needed)
        records = sorted(self.root.glob(f"*/*/{RECORD}")) if self.root.is_dir() else []
        for key in filter(None, map(_record_key, records)):
            running = self._recorded(key)
            alive = running is not None and self._alive(running)
            if key in wanted and running is not None and alive:
                self.running[key] = running
                log.info("MPS control daemon adopted", node=self.node, gpu=key.gpu, namespace=key.namespace,
                         pid=running.pid)
            elif key not in wanted:
                async with self.lock(key):
                    await self._stop(key)
            # A needed daemon that died with the earlier agent (its container) gets a new one below,
            # in the same directories: its clients' containers have them bind-mounted, and a
            # directory made anew would be another one, empty, for them.
        for key in sorted(wanted - set(self.running)):
            await self.ensure(key)
        DAEMONS.labels(self.node).set(len(self.running))

    async def reconcile(self, needed: Callable[[], set[DaemonKey]]) -> None:
        """One supervision pass: a needed daemon that died is started again (with backoff while it
        keeps failing); a daemon no claim needs any more is stopped."""
        wanted = needed()
        for key in sorted(wanted):
            running = self.running.get(key)
            if running is not None and self._alive(running):
                self._retry.pop(key, None)
                continue
            retry = self._retry.setdefault(key, _Retry())
            if time.monotonic() < retry.next_try:
                continue
            async with self.lock(key):
                running = self.running.get(key)
                if key not in needed() or (running is not None and self._alive(running)):
                    continue
                self.running.pop(key, None)
                why = ("it died" if running is not None else "it was not running")
                try:
                    await self._start(key)
                except MpsError as error:
                    retry.failures += 1
                    retry.next_try = time.monotonic() + RESTART_BACKOFF.after(retry.failures)
                    log.error("MPS control daemon could not be started again; will retry", node=self.node,
                              gpu=key.gpu, namespace=key.namespace, error=str(error),
                              retry_in=retry.next_try - time.monotonic())
                    continue
            RESTARTS.labels(self.node, key.gpu, key.namespace).inc()
            message = (f"the MPS control daemon of namespace {key.namespace} on GPU {key.gpu} was started again"
                       f" ({why}); MPS clients connected to it lost their server and must reconnect")
            log.warning(message, node=self.node, gpu=key.gpu, namespace=key.namespace)
            if self.on_restart is not None:
                await self.on_restart(key.gpu, message)
        for key in sorted(set(self.running) - wanted):
            await self.release(key, _member(key, needed))

    async def run(self, stop: asyncio.Event, needed: Callable[[], set[DaemonKey]], every: float) -> None:
        while not stop.is_set():
            try:
                await self.reconcile(needed)
            except Exception:
                log.exception("supervising the MPS control daemons failed; will retry", node=self.node)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(every):
                    await stop.wait()

    # Processes

    def _start_time(self, pid: int) -> str | None:
        try:
            stat = (self.proc / str(pid) / "stat").read_text()
        except OSError:
            return None
        fields = stat[stat.rfind(")") + 2:].split()
        return fields[19] if len(fields) > 19 and fields[0] != "Z" else None

    def _alive(self, running: Running) -> bool:
        if running.process is not None:
            return running.process.returncode is None
        return self._start_time(running.pid) == running.started

    def _recorded(self, key: DaemonKey) -> Running | None:
        try:
            body = json.loads((self.home(key) / RECORD).read_text())
            return Running(int(body["pid"]), str(body["started"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    async def _ended(self, running: Running, within: float) -> bool:
        if running.process is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(within):
                    await running.process.wait()
            return running.process.returncode is not None
        deadline = time.monotonic() + within
        while self._alive(running):
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    def _signal(self, running: Running, sig: int) -> None:
        if self._alive(running):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(running.pid, sig)


def _member(key: DaemonKey, needed: Callable[[], set[DaemonKey]]) -> Callable[[], bool]:
    return lambda: key in needed()


def _write_record(path: Path, key: DaemonKey, running: Running) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps({"gpu": key.gpu, "namespace": key.namespace, "pid": running.pid,
                                     "started": running.started}) + "\n")
    temporary.replace(path)


def _record_key(path: Path) -> DaemonKey | None:
    try:
        body = json.loads(path.read_text())
        gpu, namespace = body["gpu"], body["namespace"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return DaemonKey(gpu, namespace) if isinstance(gpu, str) and isinstance(namespace, str) else None


def _tail(path: Path, lines: int = 3) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""
