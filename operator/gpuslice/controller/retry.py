"""Asking kube-scheduler to try again pods it turned away while refused allocations were in flight.

Why (planning.reads.retry): the scheduler counts allocations it is writing when it filters; when an
admission rule refuses them (a tenant over its maxMemory), nothing tries again the pods it turned
away meanwhile, for up to 5 minutes. At most every ``--scheduler-retry-interval`` seconds the
leader looks at the pods turned away in the policies' tenant namespaces, from what it already
watches: the pods not yet on a node (one cluster-wide watch, ``spec.nodeName=`` selected by the API
server: controller.indexes) and the policies. A look makes no request at all unless one such pod is
due and something changed since it last judged (a pod turned away that it has not judged, or a
claim or slice event); only then does it read the slices and the claims, once each, cluster-wide
(never per namespace). When that pod's devices are free (on a node the pod may go to) it annotates
the DeviceClass the pod asks for (``gpuslice.dev/retry-at``): a DeviceClass change makes the
scheduler try again every pod its DRA plugin turned away, of every driver. So it is asked
sparingly: at most one change per interval, whatever the number of pods, and each pod (by UID)
asked for less and less often (the interval doubled each time it is asked, up to 5 minutes, where
the scheduler's own flush takes over). The backoff is the pod's own: a pod that is never helped
(kept out by something gpuslice does not judge: another driver's claim, the node's CPU) backs off
only itself, never another pod, let alone another tenant's. Its state is a record per pod UID,
dropped when the pod is no longer turned away.
"""

from __future__ import annotations

import asyncio
import datetime
import time
from collections.abc import Callable, Iterable, Mapping

import structlog
from prometheus_client import Counter

from gpuslice.coordinates import CLAIMS, SLICES, device_class_path
from gpuslice.dra.names import ATTRIBUTE_DOMAIN, DRIVER
from gpuslice.dra.policy_wire import tenant_namespaces
from gpuslice.jsontypes import Body
from gpuslice.kube.client import KubeClient, NotFound
from gpuslice.planning.reads.node_fit import NodeFacts
from gpuslice.planning.reads.occupancy import occupancy
from gpuslice.planning.reads.published import read_pools
from gpuslice.planning.reads.retry import Retry, to_retry, turned_away

log = structlog.get_logger(__name__)
RETRY_AT = f"{ATTRIBUTE_DOMAIN}/retry-at"
LONGEST = 300.0  # kube-scheduler's own flush of pods unschedulable this long
RETRIES = Counter("gpuslice_scheduler_retries", "Times the controller asked kube-scheduler to try again pods it"
                  " turned away while their devices were free (a DeviceClass annotated).", ["policy"])


class SchedulerRetry:
    """One per controller; every policy's daemon calls ``tick`` with what the controller's watches
    hold, and it looks at most once per interval."""

    def __init__(self, kube: KubeClient, interval: float, version: Callable[[], int] = lambda: 0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``version``: a number that changes with every event of our slices or of a claim. Times are
        ``clock``'s; None is "never": a monotonic clock counts from boot, so no zero is long ago."""
        self.kube, self.interval, self.version, self.clock = kube, interval, version, clock
        self.last: float | None = None
        self.judged: tuple[frozenset[str], int] | None = None  # pods with no room, and the version read
        self.asked: dict[str, tuple[int, float]] = {}  # pod UID -> (times asked, when last); absent: never
        self.lock = asyncio.Lock()

    async def tick(self, policies: Iterable[Body], pods: Iterable[Body],
                   nodes: Mapping[str, NodeFacts] | None = None) -> list[Retry]:
        """Look, once per interval whichever policy's daemon calls; the pods it asked to be tried
        again. ``policies``, ``pods`` (those not yet on a node) and ``nodes`` (by name; None: not
        judged) are what the controller's watches hold now."""
        if self.interval <= 0 or self.lock.locked():
            return []
        async with self.lock:
            now = self.clock()
            if self.last is not None and now - self.last < self.interval:
                return []
            self.last = now
            return await self._look(now, list(policies), list(pods), nodes)

    def _due(self, pod: str, now: float) -> bool:
        if pod not in self.asked:
            return True
        times, when = self.asked[pod]
        return now - when >= min(self.interval * 2.0 ** times, LONGEST)

    async def _look(self, now: float, policies: list[Body], pending: list[Body],
                    nodes: Mapping[str, NodeFacts] | None = None) -> list[Retry]:
        namespaces = {n for p in policies for n in tenant_namespaces(p)}
        pods = [p for p in pending if turned_away(p) and (p.get("metadata") or {}).get("namespace") in namespaces]
        waiting = {_uid(p) for p in pods}
        self.asked = {k: v for k, v in self.asked.items() if k in waiting}  # helped, or gone
        pods = [p for p in pods if self._due(_uid(p), now)]
        judged = (frozenset(_uid(p) for p in pods), self.version())
        if not pods or judged == self.judged:
            return []  # no room for them at the last read, and nothing changed since that could make it
        # Every claim takes its devices (admin access takes none): one list of each, cluster-wide.
        slices, claims = await asyncio.gather(
            self.kube.list(SLICES, fieldSelector=f"spec.driver={DRIVER}"),
            self.kube.list(CLAIMS))
        by_ref = {f"{c['metadata']['namespace']}/{c['metadata']['name']}": c for c in claims}
        retries = to_retry(pods, by_ref, policies, occupancy(read_pools(slices, claims)).gpus, nodes)
        self.judged = None if retries else judged
        if not retries:
            return []
        # Counted as asked before the change is made, so that a change refused (Forbidden) backs off too.
        for retry in retries:
            times, _ = self.asked.get(retry.uid, (0, 0.0))
            self.asked[retry.uid] = (times + 1, now)
        first = await self._change({r.device_class for r in retries})
        if first is None:
            return []
        for retry in retries:
            RETRIES.labels(retry.policy).inc()
        log.info("asked the scheduler to try again pods it turned away while their devices are free",
                 device_class=first, pods=[f"{r.pod} ({r.fits})" for r in retries[:10]],
                 count=len(retries))
        return retries


    async def _change(self, classes: set[str]) -> str | None:
        """Annotate one of ``classes`` (one DeviceClass change is enough: the scheduler tries again
        every pod DRA turned away); the next when one is gone. The class changed, or None."""
        for device_class in sorted(classes):
            try:
                await self.kube.merge_patch(device_class_path(device_class),
                                            {"metadata": {"annotations": {RETRY_AT: _stamp()}}})
                return device_class
            except NotFound:
                continue
        return None


def _uid(pod: Body) -> str:
    meta = pod.get("metadata") or {}
    return str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}")


def _stamp() -> str:
    """Unique per change (a patch with the value already there is no change, and no event)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
