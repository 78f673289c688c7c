"""One control-plane process: started in its own process group, logged to a file,
waited on until healthy, and stopped together with anything it spawned.

Children are told to die with their parent (``PR_SET_PDEATHSIG``), so a
supervisor killed with SIGKILL still leaves nothing behind. They get SIGKILL too:
the orderly stop is the supervisor's (SIGTERM in order, then SIGKILL), and once it
is gone a graceful exit has nothing to be graceful for. A kube-apiserver told to
stop while its etcd dies beside it can take minutes draining requests that cannot
finish; a dev cluster's etcd starts fresh on the next ``up`` anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import ssl
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from gpuslice.devcluster.errors import DevClusterError

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def log_tail(path: Path, lines: int = 25) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 64 * 1024))
            text = handle.read().decode(errors="replace")
    except FileNotFoundError:
        return "(no log written)"
    return "\n".join(text.splitlines()[-lines:])


HealthCheck = Callable[[], Awaitable[bool]]


def http_health(url: str, ssl_context: ssl.SSLContext | bool = True) -> HealthCheck:
    """A check that passes when ``url`` answers 200 ``ok``."""

    async def check() -> bool:
        timeout = aiohttp.ClientTimeout(total=2)
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout) as session,
                session.get(url, ssl=ssl_context) as response,
            ):
                return response.status == 200
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False

    return check


@dataclass
class Component:
    """A named process of the dev cluster."""

    name: str
    argv: Sequence[str]
    log_path: Path
    health: HealthCheck | None = None
    env: dict[str, str] | None = None
    startup_timeout: float = 60.0
    process: asyncio.subprocess.Process | None = field(default=None, init=False)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:  # noqa: ASYNC230 (a local file, opened once)
            try:
                self.process = await asyncio.create_subprocess_exec(
                    *self.argv,
                    stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log,
                    env=self.env, start_new_session=True, preexec_fn=_die_with_parent,
                )
            except OSError as error:
                raise DevClusterError(
                    f"Could not start {self.name} ({self.argv[0]}): {error.strerror}. Check that"
                    " the binary exists and is executable, or rebuild it with `make kube-bin`."
                ) from error

    def failure(self, what: str) -> DevClusterError:
        return DevClusterError(
            f"{self.name} {what}. Its log is {self.log_path}.", log_tail=log_tail(self.log_path)
        )

    async def wait_healthy(self) -> None:
        """Wait for the health check; fail early and clearly if the process exits."""
        try:
            async with asyncio.timeout(self.startup_timeout):
                while not await self._healthy_now():
                    await asyncio.sleep(0.2)
        except TimeoutError:
            what = f"did not become healthy within {self.startup_timeout:.0f} s"
            raise self.failure(what) from None

    async def _healthy_now(self) -> bool:
        if not self.running:
            code = self.process.returncode if self.process else None
            raise self.failure(f"exited with code {code} while starting")
        return self.health is None or await self.health()

    async def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the process group, then SIGKILL what is left after ``grace`` seconds."""
        if self.process is None:
            return
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, sig)
                os.killpg(self.process.pid, signal.SIGCONT)  # a paused process acts on SIGTERM only once resumed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.process.wait(), wait)
                break
        with contextlib.suppress(ProcessLookupError):  # stragglers in the group
            os.killpg(self.process.pid, signal.SIGKILL)

    def send(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the process group (faults: SIGSTOP/SIGCONT stall and resume it)."""
        if not self.running:
            raise self.failure(f"is not running (it cannot be sent {sig.name})")
        assert self.process is not None
        os.killpg(self.process.pid, sig)

    async def kill(self) -> None:
        """SIGKILL, as a crash or an OOM kill would (no SIGTERM first), and wait until it is gone."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        await self.process.wait()

    async def restart(self, *, crash: bool = False) -> None:
        """Stop (SIGTERM, or SIGKILL with ``crash``) and start again with the same command line:
        same ports, certificates and data. Returns once it is healthy."""
        await (self.kill() if crash else self.stop())
        await self.start()
        await self.wait_healthy()
