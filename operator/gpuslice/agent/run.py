"""Run the node agent: watch what affects this node's pool, publish it when it changes.

The agent's watches (``watches``) select on the server what they can: its own Node and
its own slices, every policy, and claims only while a change waits for one. They never
write; they keep the policies and the Node in memory and wake the publisher, which reads
the pool's slices (and, when a published device is to change, the claims) itself (see
``publisher``).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from dataclasses import replace

import structlog
from prometheus_client import REGISTRY, Gauge, Histogram

from gpuslice.agent.drain import RECHECK, Drains
from gpuslice.agent.events import node_ref, record_event
from gpuslice.agent.gpus import GpuBackend
from gpuslice.agent.health import HealthMonitor
from gpuslice.agent.kubeletplugin.node import NodePlugin
from gpuslice.agent.kubeletplugin.recovery import collect_stale
from gpuslice.agent.node_state.checkpoint import read_boot_id
from gpuslice.agent.node_state.gpuops import GpuOps
from gpuslice.agent.pool import NodePool
from gpuslice.agent.pool_state import PoolState
from gpuslice.agent.publisher import CYCLES
from gpuslice.agent.settings import AgentSettings
from gpuslice.agent.startup import (
    AgentStopped,
    check_cluster,
    choose_backend,
    fake_gpus_of,
    until_answered,
)
from gpuslice.agent.usage.collector import UsageCollector, UsageSettings
from gpuslice.agent.usage.podresources import PodResources
from gpuslice.agent.watches import AgentWatches
from gpuslice.backoff import Backoff, spread
from gpuslice.dra.support import Verdict
from gpuslice.inventory.gpus import Gpu
from gpuslice.kube.client import NO_ANSWER, KubeClient, KubeError, NotFound
from gpuslice.observability.logging import configure_logging
from gpuslice.observability.metrics import announce, serve_metrics
from gpuslice.planning.devices import Device

log = structlog.get_logger(__name__)
__all__ = ["AgentStopped", "publish_loop", "publish_ready", "run_agent"]

NODE_GPUS = Gauge("gpuslice_node_gpus", "GPUs the node's agent found.", ["node"])
LAST_SUCCESS = Gauge("gpuslice_agent_last_publish_success_timestamp_seconds",
                     "When a publish cycle last succeeded (written or unchanged), Unix time.", ["node"])
PUBLISH_DURATION = Histogram("gpuslice_agent_publish_duration_seconds",
                             "How long one publish cycle took (read, plan, write), failed ones included.",
                             buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0))


async def publish_loop(settings: AgentSettings, pool: NodePool, wake: asyncio.Event, stop: asyncio.Event,
                       watches: AgentWatches | None = None) -> None:
    """Publish ``pool`` on every wake-up (bursts debounced), every ``resync`` seconds, and when a
    draining device is due, each cycle under the pool's lock (prepare's check that a device is
    published never interleaves with a write). With ``watches``, the policies and the Node come
    from them once they have listed, and claims are watched only while a change waits for a claim."""
    node, resync, backoff = settings.node, settings.resync, Backoff(1.0, settings.max_backoff)
    while not stop.is_set():
        due = pool.state.drains.due_in()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(resync if due is None else min(resync, due)):
                await wake.wait()
        if stop.is_set():
            return
        await asyncio.sleep(settings.debounce)  # one cycle for a burst of events
        wake.clear()
        started = time.monotonic()
        try:
            try:
                # The wait for the lock (a prepare under way) is not the cycle's: timed once it is held.
                async with pool.lock:
                    started = time.monotonic()
                    result = await pool.publish(watches.view if watches else None)
            finally:
                PUBLISH_DURATION.observe(time.monotonic() - started)
            LAST_SUCCESS.labels(node).set(time.time())
            if watches is not None:
                watches.want_claims(pool.waits_for_claims(result))
            if result.again:
                wake.set()
            backoff.reset()
        except Exception as error:  # the loop is the agent's purpose: it outlives any failed cycle
            wait = backoff.next()
            if isinstance(error, NotFound) and error.kind == "nodes":
                log.warning("this agent's Node does not exist (yet); will retry", node=node)
            elif isinstance(error, (KubeError, *NO_ANSWER)):
                # The apiserver busy (429), restarting or slow: expected at scale, not a bug.
                log.warning("publishing failed; will retry", node=node, error=str(error) or type(error).__name__,
                            retry_in=round(wait, 1))
            else:
                log.exception("publishing failed unexpectedly; will retry", node=node, retry_in=round(wait, 1))
            CYCLES.labels(outcome="failed").inc()
            # Backoff, cut short by news: after an outage, the watches list again as soon as the API
            # server is back, and that wakes the next try at once.
            wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await wake.wait()
            wake.set()


def publish_ready(last_success: float, now: float, within: float, plugin_starting: bool = False,
                  stopping: bool = False) -> tuple[bool, str]:
    """/readyz: ready once the kubelet plugin (if any) has started and a publish cycle succeeded, as
    long as one did within ``within`` seconds, and until the agent stops."""
    if stopping:
        return False, "stopping"
    if plugin_starting:
        return False, "the kubelet plugin has not started yet (recovering its checkpoints)"
    if last_success <= 0:
        return False, "no publish cycle has succeeded yet"
    if now - last_success > within:
        return False, f"no publish cycle has succeeded for {now - last_success:.0f} s (the log says why)"
    return True, "ok"


async def stale_claims_loop(plugin: NodePlugin, stop: asyncio.Event, every: float,
                            held: PodResources | None = None) -> None:
    """Unprepare claims the kubelet never unprepared and that no longer exist (see kubeletplugin.recovery):
    every ``every`` seconds, jittered; a sweep that failed is tried again after a backoff from 1 s.
    ``held``: the kubelet's PodResources API; a claim a container holds is not asked about (when the
    kubelet cannot be asked, every prepared claim is)."""
    backoff = Backoff(1.0, every)
    while not stop.is_set():
        try:
            in_use: set[str] | None = None
            if held is not None:
                with contextlib.suppress(Exception):
                    in_use = {d.claim for d in await held.list(plugin.pool.node)}
            await collect_stale(plugin.preparer, in_use)
            backoff.reset()
            wait = spread(every)
        except Exception:
            wait = backoff.next()
            log.exception("sweeping stale claims failed; will retry", retry_in=round(wait, 1))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait):
                await stop.wait()


def usage_collector(kube: KubeClient, settings: AgentSettings, backend: GpuBackend, gpus: list[Gpu],
                    plugin: NodePlugin) -> UsageCollector:
    """Each pod's GPU use on this node, against the claims the plugin prepared."""
    def published() -> dict[str, tuple[str, int]]:
        record = plugin.pool.state.record
        last = record.load() if record is not None else None
        typed = [Device.from_manifest(d) for d in (last.devices if last else [])]
        return {d.name: (d.policy, d.memory) for d in typed if d is not None}

    return UsageCollector(
        settings.node, kube, backend, gpus, PodResources(settings.pod_resources_socket),
        plugin.preparer.checkpoints.all, published, settings.host_proc,
        UsageSettings(settings.usage_interval, settings.overuse_tolerance / 100, settings.overuse_grace))


class _Agent:
    """One agent process's phases (discover, plugin, server check, loops, shutdown) and what its
    /healthz and /readyz read of them."""

    def __init__(self, settings: AgentSettings) -> None:
        self.settings = settings
        self.stop, self.wake = asyncio.Event(), asyncio.Event()
        self.wake.set()
        self.publisher: asyncio.Task[None] | None = None
        self.helpers: list[asyncio.Task[None]] = []
        self.plugin: NodePlugin | None = None
        self.waiting_for = "discovering the GPUs"

    def alive(self) -> tuple[bool, str]:
        if self.stop.is_set():
            return True, "ok"  # stopping: the tasks end on purpose
        if self.publisher is not None and self.publisher.done():
            return False, "the publish loop has stopped"
        if any(task.done() for task in self.helpers):
            return False, ("the GPU health monitor, the stale-claims sweeper, the MPS supervisor or the usage collector"
                           " has stopped")
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        if self.publisher is None and not self.stop.is_set():
            return False, self.waiting_for
        last = REGISTRY.get_sample_value("gpuslice_agent_last_publish_success_timestamp_seconds",
                                         {"node": self.settings.node}) or 0.0
        return publish_ready(last, time.time(), self.settings.readiness_window, plugin_starting=self.plugin is None,
                             stopping=self.stop.is_set())

    async def discover(self, kube: KubeClient, backend: GpuBackend | None,
                       gpus: list[Gpu]) -> tuple[GpuBackend, list[Gpu]] | None:
        """The backend and its GPUs; a fake backend without ``--fake-gpus`` reads them from the
        Node's labels (None: stopped first)."""
        settings, node = self.settings, self.settings.node
        if backend is None:
            self.waiting_for = "reading the node's fake GPUs from its labels (the log says why it takes long)"
            spec = await until_answered(lambda: fake_gpus_of(kube, node), self.stop, node,
                                        "reading the node's fake GPU labels", settings.max_backoff)
            if spec is None:
                return None
            backend = choose_backend(settings, spec)
            gpus = await asyncio.to_thread(backend.discover)
        log.info("GPUs discovered", node=node, backend=backend.name, gpus=[(g.index, g.product_name) for g in gpus])
        NODE_GPUS.labels(node).set(len(gpus))
        return backend, gpus

    async def containers_servable(self, kube: KubeClient, backend: GpuBackend) -> bool:
        """Whether containers can be given this node's devices, asked again every ``resync`` until
        they can (False: stopped first). Until then nothing is published (a pod scheduled here could
        not start), ``/readyz`` says why and an Event on the Node says it once."""
        settings, told = self.settings, False
        while not self.stop.is_set():
            problems = await asyncio.to_thread(backend.container_problems)
            if not problems:
                if told:
                    log.info("containers can be given this node's GPUs now; publishing", node=settings.node)
                return True
            reason = "; ".join(problems)
            self.waiting_for = f"containers cannot be given this node's GPUs, nothing is published: {reason}"
            log.error("containers cannot be given this node's GPUs: nothing is published; will check again",
                      node=settings.node, problem=reason, retry_in=settings.resync)
            if not told:
                await record_event(kube, settings.node, node_ref(settings.node), "GpuContainerSetupMissing",
                                   f"gpuslice publishes no device on this node: {reason}")
                told = True
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(settings.resync):
                    await self.stop.wait()
        return False

    async def server_verdict(self, kube: KubeClient) -> Verdict | None:
        """The server's verdict once it can serve gpuslice, checked again every ``resync`` until
        then (None: stopped first)."""
        settings = self.settings
        while not self.stop.is_set():
            self.waiting_for = "checking what the API server serves (the log says why it takes long)"
            try:
                return await check_cluster(kube, settings.node, self.stop, settings.max_backoff)
            except AgentStopped as error:
                self.waiting_for = f"this cluster cannot serve gpuslice, nothing is published: {error}"
                wait = spread(settings.resync)  # a fleet refused together asks again apart
                log.error("this cluster cannot serve gpuslice: nothing is published; the kubelet plugin keeps"
                          " serving what it prepared; will check again", node=settings.node, problem=str(error),
                          retry_in=round(wait, 1))
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await self.stop.wait()
        return None

    async def serve(self, kube: KubeClient, backend: GpuBackend, gpus: list[Gpu]) -> None:
        """The kubelet plugin, then (once the server can serve gpuslice) the publisher and its
        helpers, until SIGTERM; then everything stops, the plugin first."""
        settings, node = self.settings, self.settings.node
        health = HealthMonitor(node, backend, gpus, settings.health, on_change=self.wake.set)
        await health.check()  # the first publish already carries what is wrong now
        # The kubelet plugin registers only once the node matches its checkpoints (NodePlugin.start).
        self.waiting_for = "the kubelet plugin is starting (recovering its checkpoints)"
        settings.plugin.paths.check()  # before anything is written on the node
        ops = GpuOps(backend, gpus)
        pool = NodePool(node, kube, ops, PoolState.kept_in(
            settings.plugin.resolved_state_dir, node, ops, boot_id=read_boot_id(settings.plugin.boot_id_file),
            statuses=health.taints, drains=Drains(recheck=Backoff(RECHECK, settings.resync), home=settings.home)))
        plugin = self.plugin = await NodePlugin.start(pool, backend, settings.plugin, health)
        # Prepared MPS clients keep their daemon whatever the API server does.
        self.helpers.append(asyncio.create_task(plugin.preparer.mps.run(
            self.stop, plugin.preparer.mps_daemons, settings.mps_check_interval)))
        watches = AgentWatches(kube, node, self.wake, self.stop, home=settings.home)
        try:
            verdict = await self.server_verdict(kube) if await self.containers_servable(kube, backend) else None
            if verdict is not None:
                watches.start()
                # Their policies publish nothing new here (set before the publisher starts: no cycle reads it).
                pool.state = replace(pool.state, unsupported=verdict.unsupported_modes())
                self.publisher = asyncio.create_task(publish_loop(settings, pool, self.wake, self.stop, watches))
                self.helpers.append(asyncio.create_task(health.run(kube, self.stop)))
                self.helpers.append(asyncio.create_task(stale_claims_loop(
                    plugin, self.stop, settings.resync, PodResources(settings.pod_resources_socket))))
                if settings.usage_interval > 0:
                    self.helpers.append(asyncio.create_task(
                        usage_collector(kube, settings, backend, gpus, plugin).run(self.stop)))
            await self.stop.wait()
        finally:
            await self.shutdown(plugin, watches)

    async def shutdown(self, plugin: NodePlugin, watches: AgentWatches) -> None:
        self.stop.set()
        self.wake.set()
        grace = self.settings.shutdown_grace
        # Unregister first: the kubelet stops calling before anything else goes.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace / 2):
                await plugin.stop()
        # A cycle under way may finish; a request to an apiserver going down with us must not keep
        # the agent alive for long.
        if self.publisher is not None:
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self.publisher, grace)
        await asyncio.gather(*self.helpers, return_exceptions=True)
        await watches.close()


async def run_agent(settings: AgentSettings) -> None:
    """The agent, until SIGTERM. Raises :class:`AgentStopped` (and the backend's and the plugin's
    own errors) with what to change when it cannot start here.

    The kubelet plugin starts before the API server is checked: it needs only the node's own
    checkpoints, and the kubelet must be able to unprepare what it prepared even while the server
    is away, or refuses gpuslice. A server that cannot serve gpuslice (too old, RBAC, device
    taints dropped) is checked again every ``resync``; meanwhile nothing is published and
    ``/readyz`` says why. Exiting instead would unregister the plugin, and the kubelet then
    deletes the node's slices."""
    configure_logging(settings.log_level, settings.log_format)
    agent = _Agent(settings)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, agent.stop.set)
    announce("agent")
    # A backend that needs no API server (NVML, or fake GPUs given) says what is wrong with it first.
    needs_node = settings.backend == "fake" and settings.fake_gpus is None
    backend = None if needs_node else choose_backend(settings)
    gpus = await asyncio.to_thread(backend.discover) if backend is not None else []
    # Served before the kubelet plugin starts: /healthz answers while it recovers, /readyz says why not yet.
    metrics = (await serve_metrics(settings.metrics_port, alive=agent.alive, ready=agent.ready)
               if settings.metrics_port else None)
    try:
        async with await KubeClient.from_kubeconfig(settings.kubeconfig,
                                                    request_timeout=settings.request_timeout) as kube:
            found = await agent.discover(kube, backend, gpus)
            if found is not None:
                await agent.serve(kube, *found)
    finally:
        if metrics is not None:
            await metrics.cleanup()
