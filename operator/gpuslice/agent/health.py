"""Watch the GPUs' health: poll the backend's faults, keep each GPU's state (``planning.node.health``),
and tell everyone who must know when it changes.

- the publisher, which taints the GPU's devices ``gpuslice.dev/unhealthy`` (the scheduler stops
  allocating them; with ``NoExecute`` the device-taint-eviction controller evicts their pods);
- the kubelet, through the plugin's health stream (the pod's ``allocatedResourcesStatus``);
- people: an Event on the Node and the metrics, both naming the GPU and saying why.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog
from prometheus_client import Counter, Gauge

from gpuslice.agent.events import node_ref, record_event
from gpuslice.agent.gpus import GpuBackend, GpuBackendError
from gpuslice.inventory.gpus import Gpu
from gpuslice.jsontypes import Object
from gpuslice.kube.client import KubeClient
from gpuslice.planning.node.health import UNHEALTHY_TAINT_KEY, GpuHealth, step, taint

log = structlog.get_logger(__name__)
UNHEALTHY = Gauge("gpuslice_agent_gpu_unhealthy", "1 for each GPU that is unhealthy or lost now (status:"
                  " unhealthy, lost), labelled with why (reason, its taint's value: XID-48, ECC, GPU-lost); gone once"
                  " it is healthy again.",
                  ["node", "gpu", "index", "product", "status", "reason"])
FAULTS = Counter("gpuslice_agent_gpu_faults", "Faults the GPU backend reported, by GPU and kind (xid, ecc, lost),"
                 " once per health check that reports one.",
                 ["node", "gpu", "index", "kind"])


@dataclass(frozen=True)
class HealthSettings:
    """How the agent watches GPU health. ``recovery`` is the hysteresis: an unhealthy GPU's taint is
    lifted only after this long without a fault, so a flapping GPU does not churn the slices."""

    interval: float = 2.0  # seconds between polls of the backend
    recovery: float = 300.0


class HealthMonitor:
    def __init__(self, node: str, backend: GpuBackend, gpus: list[Gpu], settings: HealthSettings,
                 on_change: Callable[[], None]) -> None:
        self.node, self.backend, self.settings = node, backend, settings
        self.gpus = {g.uuid: g for g in gpus}
        self.state: dict[str, GpuHealth] = {}
        self.version = 0
        self._changed = asyncio.Condition()
        self._on_change = on_change

    def taints(self) -> dict[str, list[Object]]:
        """The ``gpuslice.dev/unhealthy`` taint of each GPU that is not healthy, by UUID."""
        return {uuid: [t] for uuid, health in self.state.items() if (t := taint(health)) is not None}

    async def wait_for_change(self, version: int) -> None:
        """Until the health has changed since ``version`` (callers bound the wait with a timeout)."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.version != version)

    async def run(self, kube: KubeClient, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.check(kube)
            except Exception:
                log.exception("checking GPU health failed; will retry", node=self.node)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.interval):
                    await stop.wait()

    async def check(self, kube: KubeClient | None = None) -> None:
        try:
            faults = await asyncio.to_thread(self.backend.faults)
        except GpuBackendError as error:
            log.warning("could not read GPU health", node=self.node, error=str(error))
            return
        for uuid, fault in faults.items():
            gpu = self.gpus.get(uuid)
            FAULTS.labels(node=self.node, gpu=uuid, index=str(gpu.index if gpu else "?"), kind=fault.kind).inc()
        new = step(self.state, faults, time.monotonic(), self.settings.recovery)
        if new == self.state:
            return
        old, self.state = self.state, new
        for uuid in sorted(set(old) | set(new)):
            before, after = old.get(uuid), new.get(uuid)
            if (before and before.status, before and before.reason) != (after and after.status, after and after.reason):
                await self._transition(kube, uuid, before, after)
        async with self._changed:
            self.version += 1
            self._changed.notify_all()
        self._on_change()

    async def _transition(self, kube: KubeClient | None, uuid: str, before: GpuHealth | None,
                          after: GpuHealth | None) -> None:
        gpu = self.gpus.get(uuid)
        index, product = (str(gpu.index), gpu.product_name) if gpu else ("?", "unknown GPU")
        where = f"GPU {index} ({uuid}, {product})"
        if before is not None:
            with contextlib.suppress(KeyError):
                UNHEALTHY.remove(self.node, uuid, index, product, before.status, before.reason)
        if after is not None:
            UNHEALTHY.labels(node=self.node, gpu=uuid, index=index, product=product, status=after.status,
                             reason=after.reason).set(1)
            effect = "NoExecute" if after.status == "lost" else "NoSchedule"
            reason = "GpuLost" if after.status == "lost" else "GpuUnhealthy"
            message = (f"{where} is {'lost' if after.status == 'lost' else 'unhealthy'}: {after.message}. Its devices"
                       f" are tainted {UNHEALTHY_TAINT_KEY}={after.reason}:{effect}"
                       + ("; pods using them are evicted." if effect == "NoExecute" else
                          "; no new claim gets them, running pods keep them."))
            log.warning("GPU unhealthy", node=self.node, gpu=uuid, index=index, status=after.status,
                        reason=after.reason, message=after.message)
            await record_event(kube, self.node, node_ref(self.node), reason, message, "Warning")
        else:
            message = (f"{where} has been healthy for {self.settings.recovery:g} s since its last fault"
                       f" ({before.reason if before else ''}); the {UNHEALTHY_TAINT_KEY} taint is lifted.")
            log.info("GPU healthy again", node=self.node, gpu=uuid, index=index)
            await record_event(kube, self.node, node_ref(self.node), "GpuHealthy", message, "Normal")
