"""Run the node agent: watch what affects this node's pool, publish it when it changes.

Kopf watches policies, this Node, the claims and this pool's slices with
event handlers only, so the agent never writes to a policy or a Node (no
finalizers, no annotations). The handlers just wake the publisher, which reads
the authoritative state itself (see ``publisher``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from typing import Any

import kopf
import structlog

from gpuslice.agent.drain import Drains
from gpuslice.agent.dryrun import Refusals
from gpuslice.agent.gpus import GpuBackend
from gpuslice.agent.publisher import CYCLES, publish
from gpuslice.dra.names import DRIVER
from gpuslice.inventory.gpus import Gpu
from gpuslice.kube.client import EndlessBackoff, KubeClient, KubeError
from gpuslice.observability.logging import configure_logging
from gpuslice.observability.metrics import serve_metrics

log = structlog.get_logger(__name__)
DEBOUNCE = 0.3
MAX_BACKOFF = 10.0  # seconds between tries of a failing cycle, at most
SHUTDOWN_GRACE = 10.0  # seconds from SIGTERM to a forced exit (Kopf's ultimate exiting timeout)


def build_agent_registry(node: str, wake: asyncio.Event, kubeconfig: str | None) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    in_pool: set[tuple[str, str]] = set()

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.scanning.disabled = True
        settings.posting.enabled = False
        settings.process.ultimate_exiting_timeout = SHUTDOWN_GRACE  # see the controller's handlers
        settings.watching.server_timeout = 600
        settings.networking.error_backoffs = EndlessBackoff()  # back within 5 s of the API server

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        if kubeconfig is None and (found := kopf.login_with_service_account(**kwargs)) is not None:
            return found
        return kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.event("gpuslice.dev", "v1alpha1", "gpuslicepolicies", registry=registry)
    def policy_event(**_: Any) -> None:
        wake.set()

    @kopf.on.event("v1", "nodes", registry=registry, when=lambda name, **_: name == node)
    def node_event(**_: Any) -> None:
        wake.set()

    @kopf.on.event("resource.k8s.io", "v1", "resourceslices", registry=registry,
                   when=lambda spec, **_: spec.get("nodeName") == node and spec.get("driver") == DRIVER)
    def slice_event(**_: Any) -> None:
        wake.set()  # someone changed or removed our slices: put them back

    @kopf.on.event("resource.k8s.io", "v1", "resourceclaims", registry=registry)
    def claim_event(namespace: str | None, name: str, status: kopf.Status, type: str | None, **_: Any) -> None:
        key = (namespace or "", name)
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
        ours = type != "DELETED" and any(r.get("driver") == DRIVER and r.get("pool") == node for r in results)
        if ours or key in in_pool:
            wake.set()  # allocated from, or released back to, this pool
        if ours:
            in_pool.add(key)
        else:
            in_pool.discard(key)

    return registry


async def publish_loop(kube: KubeClient, node: str, gpus: list[Gpu], wake: asyncio.Event, stop: asyncio.Event,
                       resync: float) -> None:
    backoff = 1.0
    drains, refusals = Drains(), Refusals()
    while not stop.is_set():
        due = drains.due_in()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), resync if due is None else min(resync, due))
        if stop.is_set():
            return
        await asyncio.sleep(DEBOUNCE)  # one cycle for a burst of events
        wake.clear()
        try:
            await publish(kube, node, gpus, drains, refusals)
            backoff = 1.0
        except Exception as error:  # the loop is the agent's purpose: it outlives any failed cycle
            if isinstance(error, KubeError) and error.status == 404 and "nodes" in error.message:
                log.warning("this agent's Node does not exist (yet); will retry", node=node)
            elif isinstance(error, KubeError):
                log.warning("publishing failed; will retry", node=node, error=str(error), retry_in=backoff)
            else:
                log.exception("publishing failed unexpectedly; will retry", node=node, retry_in=backoff)
            CYCLES.labels(outcome="failed").inc()
            # Backoff, cut short by news: after an outage, Kopf's watches list everything again as soon
            # as the API server is back, and that wakes the next try at once.
            wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), backoff)
            backoff = min(backoff * 2, MAX_BACKOFF)
            wake.set()


async def discover_fake_from_node(kube: KubeClient, node: str) -> str:
    """For --backend fake without --fake-gpus: the node's own fake-GPU labels (kind, dev cluster)."""
    from gpuslice.inventory.nodes import FAKE_COUNT, FAKE_MODEL

    labels = (await kube.get(f"/api/v1/nodes/{node}"))["metadata"].get("labels") or {}
    if FAKE_MODEL not in labels:
        raise SystemExit(f"agent: node {node} has no {FAKE_MODEL} label; pass --fake-gpus MODEL:COUNT.")
    return f"{labels[FAKE_MODEL]}:{labels.get(FAKE_COUNT, '1')}"


async def run_agent(node: str, backend: GpuBackend, kubeconfig: str | None, resync: float,
                    metrics_port: int | None = None) -> None:
    configure_logging()
    if kubeconfig:
        os.environ["KUBECONFIG"] = kubeconfig
    gpus = await asyncio.to_thread(backend.discover)
    log.info("GPUs discovered", node=node, backend=backend.name, gpus=[(g.index, g.product_name) for g in gpus])
    stop, wake = asyncio.Event(), asyncio.Event()
    wake.set()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    metrics = await serve_metrics(metrics_port) if metrics_port else None
    async with await KubeClient.from_kubeconfig(kubeconfig) as kube:
        publisher = asyncio.create_task(publish_loop(kube, node, gpus, wake, stop, resync))
        try:
            await kopf.operator(registry=build_agent_registry(node, wake, kubeconfig), clusterwide=True,
                                standalone=True, stop_flag=stop)
        finally:
            stop.set()
            wake.set()
            await publisher
            if metrics is not None:
                await metrics.cleanup()
