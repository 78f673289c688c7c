"""Measure each pod's GPU use on this node every ``--usage-interval`` seconds, and act on overuse.

One pass:

1. the kubelet's PodResources API: which container of which pod holds which device of this node's
   pool (``podresources``);
2. the claim checkpoints: each such device's GPU, policy and allocation (the slice's size, or the
   claim's consumed capacity on a shared device);
3. the backend: each GPU's processes with their device memory and SM share;
4. each process's ``/proc/<pid>/cgroup`` (the node's ``/proc``: ``--host-proc``): the pod UID it
   runs under; the pods' UIDs come from their claims' ``status.reservedFor`` (read once per claim,
   again when a process names a UID not seen yet), since the kubelet's API names pods by name;
5. ``planning.gpu_use.measure`` and the overuse tracker; metrics (``metrics``) and, for a pod over
   its allocation beyond the tolerance for the grace, the actions of its policy (``actions``).

A pass that cannot read the kubelet or the GPUs is counted as failed and logged; the next one
tries again. It never touches a GPU or a prepared claim.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from gpuslice.agent.gpus import GpuBackend, GpuBackendError, GpuProcess
from gpuslice.agent.kubeletplugin.checkpoint import ClaimCheckpoint, PreparedDevice
from gpuslice.agent.usage.actions import CONDITION, OveruseActions
from gpuslice.agent.usage.metrics import OVERUSE_ACTIONS, USAGE_PASSES, USE, UseSnapshot
from gpuslice.agent.usage.podresources import HeldDevice, PodResources, PodResourcesError
from gpuslice.dra.names import DRIVER
from gpuslice.inventory.gpus import Gpu
from gpuslice.kube.client import KubeClient, KubeError
from gpuslice.planning.gpu_use import Holding, NodeUse, OveruseTracker, PodGpuUse, PodRef, measure, parse_cgroup

log = structlog.get_logger(__name__)
CLAIM = "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"
REREAD = 30.0  # seconds before a claim is read again for a pod UID it did not name


@dataclass(frozen=True)
class UsageSettings:
    interval: float = 10.0
    tolerance: float = 0.05
    grace: float = 30.0


@dataclass
class _ClaimRead:
    at: float
    pods: dict[str, str]  # pod UID -> pod name (its namespace is the claim's)
    stale_condition: bool  # our overuse condition says True on it (left by an earlier agent)


@dataclass
class UsageCollector:
    node: str
    kube: KubeClient
    backend: GpuBackend
    gpus: list[Gpu]
    kubelet: PodResources
    checkpoints: Callable[[], list[ClaimCheckpoint]]
    policies: Callable[[], Mapping[str, Mapping[str, Any]]]  # name -> body (the agent's watch)
    published: Callable[[], Mapping[str, tuple[str, int]]]  # device -> (policy, memory), for old checkpoints
    host_proc: Path = Path("/proc")
    settings: UsageSettings = field(default_factory=UsageSettings)
    tracker: OveruseTracker = field(init=False)
    actions: OveruseActions = field(init=False)
    _claims: dict[str, _ClaimRead] = field(default_factory=dict)
    _evicting: dict[tuple[PodRef, str], str] = field(default_factory=dict)  # -> pod UID, while Evict is pending
    _failing: bool = False  # said once, until a pass succeeds again

    def __post_init__(self) -> None:
        self.tracker = OveruseTracker(self.settings.tolerance, self.settings.grace)
        self.actions = OveruseActions(self.kube, self.node)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.once(time.monotonic())
                USAGE_PASSES.labels("ok").inc()
                if self._failing:
                    log.info("measuring the pods' GPU use works again", node=self.node)
                self._failing = False
            except (PodResourcesError, GpuBackendError) as error:
                USAGE_PASSES.labels("failed").inc()
                # Said once (the counter and its alert keep counting): a node without the kubelet's
                # socket mounted must not fill the log every pass.
                (log.debug if self._failing else log.warning)(
                    "measuring the pods' GPU use failed; will retry", node=self.node, error=str(error))
                self._failing = True
            except Exception:
                USAGE_PASSES.labels("failed").inc()
                log.exception("measuring the pods' GPU use failed unexpectedly; will retry", node=self.node)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.interval):
                    await stop.wait()
        await self.kubelet.close()

    async def once(self, now: float) -> NodeUse:
        held = await self.kubelet.list(self.node)
        holdings = self._holdings(held)
        processes = [p for gpu in self.gpus for p in await asyncio.to_thread(self.backend.processes, gpu)]
        cgroups = {p.pid: self._pod_uid(p) for p in processes}
        uids = await self._pod_uids(held, {uid for uid in cgroups.values() if uid}, now)
        by_uid = {uid: pod for pod, uid in uids.items()}
        pod_of_pid = {pid: by_uid[uid] for pid, uid in cgroups.items() if uid in by_uid}
        use = measure(holdings, processes, pod_of_pid)
        started, ended = self.tracker.update(use.pods, now)
        for pod_use in started:
            await self._started(pod_use, uids.get(pod_use.pod, ""))
        for pod_use in ended:
            self._evicting.pop((pod_use.pod, pod_use.gpu), None)
            await self.actions.ended(pod_use, uids.get(pod_use.pod, ""))
        await self._evict_again(use)
        await self._clear_stale(use)
        USE.snapshot = UseSnapshot(
            self.node, use, frozenset((str(u.pod), u.gpu) for u in use.pods if self.tracker.overusing(u.pod, u.gpu)),
            tuple(g.uuid for g in self.gpus))
        return use

    # Who holds what

    def _holdings(self, held: list[HeldDevice]) -> list[Holding]:
        prepared: dict[tuple[str, str, str], PreparedDevice] = {}
        for checkpoint in self.checkpoints():
            if checkpoint.phase != "completed":
                continue
            for record in checkpoint.devices:
                prepared[(checkpoint.key, record.device, record.share_id or "")] = record
        published = self.published()
        found = []
        for device in held:
            got = prepared.get((device.claim, device.device, device.share_id or ""))
            if got is None or got.admin_access:
                continue  # not prepared here (yet), or admin access: it holds nothing back
            policy, memory = published.get(device.device, ("", 0))
            allocated = got.allocated if got.allocated is not None else (
                got.consumed_memory if got.consumed_memory is not None else memory)
            found.append(Holding(device.pod, device.container, device.claim, device.device, device.share_id,
                                 got.gpu_uuid, got.policy or policy, allocated))
        return found

    def _pod_uid(self, process: GpuProcess) -> str | None:
        try:
            cgroup = parse_cgroup((self.host_proc / str(process.pid) / "cgroup").read_text())
        except OSError:
            return None  # it ended, or the agent does not see the node's processes (--host-proc)
        return cgroup.pod_uid if cgroup is not None else None

    async def _pod_uids(self, held: list[HeldDevice], seen: set[str], now: float) -> dict[PodRef, str]:
        """Each pod holding devices, by UID, from its claims' reservedFor; a claim is read once, and again
        (at most every REREAD seconds) when a process names a UID none of the claims named."""
        known = {uid for read in self._claims.values() for uid in read.pods}
        unknown = bool(seen - known)
        claims = {d.claim for d in held}
        for claim in sorted(claims):
            read = self._claims.get(claim)
            if read is not None and not (unknown and now - read.at >= REREAD):
                continue
            namespace, name = claim.split("/", 1)
            try:
                body = await self.kube.get(CLAIM.format(namespace=namespace, name=name))
            except KubeError as error:
                log.warning("could not read a claim for its pods' UIDs", node=self.node, claim=claim, error=str(error))
                continue
            status = body.get("status") or {}
            pods = {str(r["uid"]): str(r["name"]) for r in status.get("reservedFor") or []
                    if r.get("resource") == "pods" and r.get("uid")}
            stale = any(c.get("type") == CONDITION and c.get("status") == "True"
                        for d in status.get("devices") or [] if d.get("driver") == DRIVER and d.get("pool") == self.node
                        for c in d.get("conditions") or [])
            self._claims[claim] = _ClaimRead(now, pods, stale)
        for claim in set(self._claims) - claims:
            del self._claims[claim]  # its pods are gone from the node
        uids: dict[PodRef, str] = {}
        for claim, read in self._claims.items():
            namespace = claim.split("/", 1)[0]
            for uid, pod in read.pods.items():
                uids.setdefault(PodRef(namespace, pod), uid)
        return uids

    # Acting

    def _action(self, policy: str) -> str:
        spec = (self.policies().get(policy) or {}).get("spec") or {}
        return str(spec.get("onOveruse") or "Report")

    async def _started(self, use: PodGpuUse, uid: str) -> None:
        evict = self._action(use.policy) == "Evict"
        done = await self.actions.started(use, uid, self.settings.tolerance, evict)
        OVERUSE_ACTIONS.labels(self.node, use.policy, use.pod.namespace, done).inc()
        if done == "eviction_blocked":
            self._evicting[(use.pod, use.gpu)] = uid

    async def _evict_again(self, use: NodeUse) -> None:
        """An eviction a PodDisruptionBudget refused is tried again while the pod still overuses."""
        current = {(u.pod, u.gpu): u for u in use.pods}
        for key, uid in list(self._evicting.items()):
            pod_use = current.get(key)
            if pod_use is None or not self.tracker.overusing(*key):
                del self._evicting[key]
                continue
            done = await self.actions.evict(pod_use, uid, tell=False)
            if done == "evicted":
                del self._evicting[key]
                OVERUSE_ACTIONS.labels(self.node, pod_use.policy, pod_use.pod.namespace, done).inc()

    async def _clear_stale(self, use: NodeUse) -> None:
        """A condition an earlier agent left True on a claim whose pod is within its allocation now."""
        for pod_use in use.pods:
            if self.tracker.overusing(pod_use.pod, pod_use.gpu):
                continue
            stale = [c for c in pod_use.claims if (read := self._claims.get(c)) is not None and read.stale_condition]
            if stale:
                await self.actions.condition(pod_use, False, "WithinAllocation",
                                             f"pod {pod_use.pod} is within its allocation on GPU {pod_use.gpu}")
                for claim in stale:
                    self._claims[claim].stale_condition = False
