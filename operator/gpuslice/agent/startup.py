"""What the agent settles before it publishes anything: its GPUs, and what the API server serves.

The server check (``kube.compatibility``) is the controller's, plus a dry run of this node's
slices with every field the agent writes: a feature gate that is off makes the apiserver drop
a field without an error, and a device published without its counters or taints is unsafe.
A server that cannot be asked yet (starting, restarting, the Node not registered) is asked
again; one that answers no keeps the agent from publishing (``run``), and the modes whose fields
are dropped publish nothing on this node.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

import structlog

from gpuslice.agent.gpus import GpuBackend
from gpuslice.agent.settings import AgentSettings
from gpuslice.backoff import Backoff
from gpuslice.coordinates import node_path
from gpuslice.dra.support import Verdict
from gpuslice.errors import GpusliceError
from gpuslice.inventory.nodes import FAKE_COUNT, FAKE_MODEL, FAKE_SYSTEM
from gpuslice.kube.client import NO_ANSWER, KubeClient, KubeError, NotFound
from gpuslice.kube.compatibility import check_fields, check_server

log = structlog.get_logger(__name__)
T = TypeVar("T")


class AgentStopped(GpusliceError):
    """The agent cannot run on this cluster or node; the message says why and what to change."""


async def until_answered(ask: Callable[[], Awaitable[T]], stop: asyncio.Event, node: str, what: str,
                         max_backoff: float = 10.0) -> T | None:
    """``ask()``, again while the server cannot answer it (unreachable, starting, 5xx, 429, "not yet
    ready", the Node not registered yet); None once stopped, even mid-request. A definite no
    (RBAC, a bad request) raises :class:`AgentStopped`."""
    backoff = Backoff(1.0, max_backoff)
    while not stop.is_set():
        asking, stopping = asyncio.ensure_future(ask()), asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({asking, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:  # stopped, or cancelled from outside: the request in flight goes too
            stopping.cancel()
            if not asking.done():
                asking.cancel()
                with contextlib.suppress(BaseException):
                    await asking
        if asking.cancelled():
            return None
        try:
            return asking.result()
        except KubeError as error:
            if not (error.transient or isinstance(error, NotFound)):
                raise AgentStopped(f"{what}: the API server refused: {error}") from None
            reason = str(error)
        except NO_ANSWER as error:
            reason = str(error) or type(error).__name__
        # Jittered: after an outage a fleet's agents must not ask again in step.
        wait = backoff.next()
        log.warning(f"{what}: the API server cannot answer yet; will ask again", node=node, error=reason,
                    retry_in=round(wait, 1))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait):
                await stop.wait()
    return None


async def check_cluster(kube: KubeClient, node: str, stop: asyncio.Event, max_backoff: float = 10.0) -> Verdict | None:
    """The server's verdict, asked until it answers (None: stopped first). Raises
    :class:`AgentStopped` when the server refuses to be asked (RBAC) or cannot serve gpuslice."""

    async def ask() -> Verdict:
        verdict = await check_server(kube)
        return await check_fields(kube, node, verdict) if verdict.ok else verdict

    verdict = await until_answered(ask, stop, node, "checking what the API server serves", max_backoff)
    if verdict is None:
        return None
    for warning in verdict.warnings:
        log.warning("server check", node=node, warning=warning)
    if not verdict.ok:
        raise AgentStopped("; ".join(verdict.problems))
    log.info("server check passed", node=node, version=verdict.version,
             unsupported_modes=sorted(verdict.unsupported_modes()))
    return verdict


async def fake_gpus_of(kube: KubeClient, node: str) -> str:
    """The fake backend's GPUs from the node's own labels (kind, the dev cluster)."""
    labels = (await kube.get(node_path(node)))["metadata"].get("labels") or {}
    if labels.get(FAKE_SYSTEM):
        return str(labels[FAKE_SYSTEM])
    if FAKE_MODEL not in labels:
        raise AgentStopped(f"node {node} has no {FAKE_MODEL} label; pass --fake-gpus MODEL:COUNT.")
    return f"{labels[FAKE_MODEL]}:{labels.get(FAKE_COUNT, '1')}"


def choose_backend(settings: AgentSettings, fake_gpus: str | None = None) -> GpuBackend:
    """The GPUs' backend; ``fake_gpus`` (MODEL:COUNT,...) when the fake one's come from the Node."""
    if settings.backend == "nvml":
        from gpuslice.agent.gpus.nvidia_cdi import DEFAULT_SPEC_DIRS
        from gpuslice.agent.gpus.nvml import NvmlBackend

        return NvmlBackend(cdi_dirs=settings.nvidia_cdi_dir or DEFAULT_SPEC_DIRS, proc=settings.host_proc,
                           driver_root=settings.nvidia_driver_root, mps_args=settings.mps_daemon_args)
    from gpuslice.agent.gpus.fake import FakeBackend, parse_fake_gpus

    spec = fake_gpus or settings.fake_gpus
    if spec is None:
        raise ValueError("the fake backend needs --fake-gpus or the node's labels")
    return FakeBackend(settings.node, parse_fake_gpus(spec), settings.plugin.resolved_state_dir)
