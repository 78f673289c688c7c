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
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import kopf
import structlog

from gpuslice.agent.gpus import GpuBackend
from gpuslice.agent.health import HealthMonitor
from gpuslice.agent.kubeletplugin.node import NodePlugin
from gpuslice.agent.kubeletplugin.recovery import collect_stale
from gpuslice.agent.kubeletplugin.settings import PluginSettings
from gpuslice.agent.publisher import Drains, publish
from gpuslice.agent.settings import HealthSettings
from gpuslice.dra.names import DRIVER
from gpuslice.inventory.gpus import Gpu
from gpuslice.kube.client import KubeClient, KubeError
from gpuslice.observability.logging import configure_logging
from gpuslice.observability.metrics import serve_metrics
from gpuslice.planning.taints import Taint

log = structlog.get_logger(__name__)
DEBOUNCE = 0.3
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
                       resync: float, plugin: NodePlugin | None = None,
                       statuses: Callable[[], Mapping[str, Sequence[Taint]]] = dict) -> None:
    backoff = 1.0
    drains = Drains()
    while not stop.is_set():
        now = time.monotonic()
        dues = [d for d in (drains.due_in(now), plugin.mig.due_in(now) if plugin else None) if d is not None]
        due = min(dues) if dues else None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(resync if due is None else min(resync, due)):
                await wake.wait()  # (no wait_for: Kopf cancels tasks made while it runs, wait_for's too)
        if stop.is_set():
            return
        await asyncio.sleep(DEBOUNCE)  # one cycle for a burst of events
        wake.clear()
        try:
            if plugin is None:
                await publish(kube, node, gpus, drains, statuses=statuses())
            else:  # one at a time with prepare's check that a device is published (see kubeletplugin.prepare)
                async with plugin.pool_lock:
                    result = await publish(kube, node, gpus, drains, holds=plugin.preparer.held_devices(),
                                           record=plugin.record, statuses=statuses(), mig=plugin.mig)
                if result.again:
                    wake.set()
            backoff = 1.0
        except Exception as error:  # the loop is the agent's purpose: it outlives any failed cycle
            if isinstance(error, KubeError) and error.status == 404 and "nodes" in error.message:
                log.warning("this agent's Node does not exist (yet); will retry", node=node)
            elif isinstance(error, KubeError):
                log.warning("publishing failed; will retry", node=node, error=str(error), retry_in=backoff)
            else:
                log.exception("publishing failed unexpectedly; will retry", node=node, retry_in=backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 30.0)
            wake.set()


async def discover_fake_from_node(kube: KubeClient, node: str) -> str:
    """For --backend fake without --fake-gpus: the node's own fake-GPU labels (kind, dev cluster)."""
    from gpuslice.inventory.nodes import FAKE_COUNT, FAKE_MODEL

    labels = (await kube.get(f"/api/v1/nodes/{node}"))["metadata"].get("labels") or {}
    if FAKE_MODEL not in labels:
        raise SystemExit(f"agent: node {node} has no {FAKE_MODEL} label; pass --fake-gpus MODEL:COUNT.")
    return f"{labels[FAKE_MODEL]}:{labels.get(FAKE_COUNT, '1')}"


async def stale_claims_loop(plugin: NodePlugin, stop: asyncio.Event, every: float) -> None:
    """Unprepare claims the kubelet never unprepared and that no longer exist (see kubeletplugin.recovery)."""
    while not stop.is_set():
        try:
            await collect_stale(plugin.preparer)
        except Exception:
            log.exception("sweeping stale claims failed; will retry")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(every):
                await stop.wait()


async def _shut_down_in_order(stopping: asyncio.Event, stop: asyncio.Event, plugin: NodePlugin | None) -> None:
    await stopping.wait()
    if plugin is not None:
        try:
            async with asyncio.timeout(SHUTDOWN_GRACE / 2):
                await plugin.stop()
        except TimeoutError:
            log.warning("the kubelet plugin did not stop in time")
    stop.set()


async def run_agent(node: str, backend: GpuBackend, kubeconfig: str | None, resync: float,
                    metrics_port: int | None = None, plugin_settings: PluginSettings | None = None,
                    health_settings: HealthSettings | None = None) -> None:
    configure_logging()
    if kubeconfig:
        os.environ["KUBECONFIG"] = kubeconfig
    gpus = await asyncio.to_thread(backend.discover)
    log.info("GPUs discovered", node=node, backend=backend.name, gpus=[(g.index, g.product_name) for g in gpus])
    # A signal first takes the kubelet plugin down (unregistered, no call in flight), then stops the
    # rest: Kopf cancels every task created while it ran, which would include gRPC's own.
    stopping, stop, wake = asyncio.Event(), asyncio.Event(), asyncio.Event()
    wake.set()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if not stopping.is_set():
            stopping.set()
            # Exit for sure: a request to an apiserver going down with us must not keep the agent alive.
            loop.call_later(SHUTDOWN_GRACE, os.kill, os.getpid(), signal.SIGKILL)

    def handle_signals() -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal)

    handle_signals()
    metrics = await serve_metrics(metrics_port) if metrics_port else None
    health = HealthMonitor(node, backend, gpus, health_settings or HealthSettings(), on_change=wake.set)
    async with await KubeClient.from_kubeconfig(kubeconfig) as kube:
        await health.check()  # the first publish already carries what is wrong now
        plugin = None
        if plugin_settings is not None:
            plugin = await NodePlugin.start(node, kube, backend, gpus, plugin_settings, health)
        tasks = [asyncio.create_task(publish_loop(kube, node, gpus, wake, stop, resync, plugin, health.taints)),
                 asyncio.create_task(health.run(kube, stop)),
                 asyncio.create_task(_shut_down_in_order(stopping, stop, plugin))]
        if plugin is not None:
            tasks.append(asyncio.create_task(stale_claims_loop(plugin, stop, resync)))
        try:
            existing = asyncio.all_tasks()
            operator_tasks = await kopf.spawn_tasks(registry=build_agent_registry(node, wake, kubeconfig),
                                                    clusterwide=True, standalone=True, stop_flag=stop)
            handle_signals()  # Kopf installed its own; ours stop the plugin first
            await kopf.run_tasks(operator_tasks, ignored=existing)
        finally:
            stopping.set()
            stop.set()
            wake.set()
            await asyncio.gather(*tasks)
            if metrics is not None:
                await metrics.cleanup()
