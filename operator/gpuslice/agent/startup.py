"""What the agent settles before it publishes anything: its GPUs, and what the API server serves.

The server check (``kube.compatibility``) is the controller's, plus a dry run of this node's
slices with every field the agent writes: a feature gate that is off makes the apiserver drop
a field without an error, and a device published without its counters or taints is unsafe.
A server that cannot be asked yet (starting, restarting, the Node not registered) is asked
again; one that answers no stops the agent with the reason, which the pod's log and its
CrashLoopBackOff show. The modes whose fields are dropped publish nothing on this node.
"""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
import structlog

from gpuslice.agent.gpus import GpuBackend
from gpuslice.agent.settings import AgentSettings
from gpuslice.dra.support import FEATURES, Verdict
from gpuslice.kube.client import KubeClient, KubeError, NotFound
from gpuslice.kube.compatibility import check_fields, check_server

log = structlog.get_logger(__name__)


class AgentStopped(Exception):
    """The agent cannot run on this cluster or node; the message says why and what to change."""


async def check_cluster(kube: KubeClient, node: str, stop: asyncio.Event, max_backoff: float = 10.0) -> Verdict | None:
    """The server's verdict, asked until it answers (None: stopped while waiting). Raises
    :class:`AgentStopped` when the server refuses to be asked (RBAC) or cannot serve gpuslice."""
    delay = 1.0
    while not stop.is_set():
        try:
            verdict = await check_server(kube)
            if verdict.ok:
                verdict = await check_fields(kube, node, verdict)
        except KubeError as error:
            if not (error.transient or isinstance(error, NotFound)):
                raise AgentStopped(f"the API server could not be asked what it serves: {error}") from None
            reason = str(error)
        except (aiohttp.ClientError, TimeoutError, ConnectionError) as error:
            reason = str(error) or type(error).__name__
        else:
            for warning in verdict.warnings:
                log.warning("server check", node=node, warning=warning)
            if not verdict.ok:
                raise AgentStopped("; ".join(verdict.problems))
            log.info("server check passed", node=node, version=verdict.version,
                     unsupported_modes=sorted(verdict.unsupported_modes()))
            return verdict
        log.warning("could not check the API server yet; will retry", node=node, error=reason, retry_in=delay)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await stop.wait()
        delay = min(delay * 2, max_backoff)
    return None


def unsupported(verdict: Verdict) -> dict[str, str]:
    """Slicing mode -> why the server cannot serve it (the feature gate to turn on)."""
    reasons: dict[str, str] = {}
    for key in verdict.missing:
        feature = FEATURES[key]
        for mode in feature.modes:
            reasons.setdefault(mode, f"the API server drops the fields of {feature.what}; turn on the feature gate"
                                     f" {feature.gate} on the apiserver and scheduler")
    return reasons


async def choose_backend(kube: KubeClient | None, settings: AgentSettings) -> GpuBackend:
    """The GPUs' backend; the fake one reads its GPUs from the node's labels unless told (``kube``
    is needed only then)."""
    if settings.backend == "nvml":
        from gpuslice.agent.gpus.nvml import NvmlBackend

        return NvmlBackend(cdi_dirs=settings.nvidia_cdi_dir) if settings.nvidia_cdi_dir else NvmlBackend()
    from gpuslice.agent.gpus.fake import FakeBackend, parse_fake_gpus
    from gpuslice.inventory.nodes import FAKE_COUNT, FAKE_MODEL

    spec = settings.fake_gpus
    if spec is None:
        if kube is None:
            raise ValueError("the fake backend reads its GPUs from the Node: pass the API client")
        labels = (await kube.get(f"/api/v1/nodes/{settings.node}"))["metadata"].get("labels") or {}
        if FAKE_MODEL not in labels:
            raise AgentStopped(f"node {settings.node} has no {FAKE_MODEL} label; pass --fake-gpus MODEL:COUNT.")
        spec = f"{labels[FAKE_MODEL]}:{labels.get(FAKE_COUNT, '1')}"
    return FakeBackend(settings.node, parse_fake_gpus(spec), settings.plugin.resolved_state_dir)
