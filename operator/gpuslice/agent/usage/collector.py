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
5. ``planning.node.gpu_use.measure`` and the overuse tracker; metrics (``metrics``) and, for a pod over
   its allocation beyond the tolerance for the grace, a mark on its claims (``actions``), which the
   controller acts on (Events, and eviction where the policy says ``onOveruse: Evict``).

A pass that cannot read the kubelet or the GPUs is counted as failed and logged; the next one
tries again. It never touches a GPU or a prepared claim.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from gpuslice.agent.events import node_ref, record_event
from gpuslice.agent.gpus import GpuBackend, GpuBackendError, GpuProcess
from gpuslice.agent.kubeletplugin.checkpoint import ClaimCheckpoint, PreparedDevice
from gpuslice.agent.usage.actions import apply_marks
from gpuslice.agent.usage.metrics import USAGE_PASSES, USE, UseSnapshot
from gpuslice.agent.usage.pidns import sees_node_pids
from gpuslice.agent.usage.podresources import HeldDevice, PodResources, PodResourcesError
from gpuslice.dra.quantity import format_bytes
from gpuslice.dra.wire import reserved_for
from gpuslice.inventory.gpus import Gpu
from gpuslice.kube.client import KubeClient, KubeError
from gpuslice.observability.metrics import OVERUSE_ACTIONS
from gpuslice.planning.node.gpu_use import Holding, NodeUse, OveruseTracker, PodGpuUse, PodRef, measure, parse_cgroup
from gpuslice.planning.overuse import DeviceKey, Mark, Overuser, read_marks, summary

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


def describe(use: PodGpuUse, tolerance: float) -> str:
    where = f" (container {use.container})" if use.container else ""
    return (f"pod {use.pod}{where} uses {format_bytes(use.used)} of GPU memory on GPU {use.gpu}, more than the"
            f" {format_bytes(use.allocated)} its claims ({', '.join(use.claims)}) were allocated there (policy"
            f" {use.policy}, tolerance {tolerance:.0%}); its neighbours on the GPU may fail to allocate")


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class UsageCollector:
    node: str
    kube: KubeClient
    backend: GpuBackend
    gpus: list[Gpu]
    kubelet: PodResources
    checkpoints: Callable[[], list[ClaimCheckpoint]]
    published: Callable[[], Mapping[str, tuple[str, int]]]  # device -> (policy, memory), for old checkpoints
    host_proc: Path = Path("/proc")
    settings: UsageSettings = field(default_factory=UsageSettings)
    tracker: OveruseTracker = field(init=False)
    _claims: dict[str, _ClaimRead] = field(default_factory=dict)
    _marks: dict[str, dict[DeviceKey, Mark]] = field(default_factory=dict)  # claim -> what it says now
    _reported: dict[tuple[PodRef, str], tuple[str, str]] = field(default_factory=dict)  # -> (since, message)
    _failing: bool = False  # said once, until a pass succeeds again
    _unread: set[str] = field(default_factory=set)  # GPUs whose processes the last pass could not read

    def __post_init__(self) -> None:
        self.tracker = OveruseTracker(self.settings.tolerance, self.settings.grace)

    async def run(self, stop: asyncio.Event) -> None:
        await self.check_pid_namespace()
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

    async def check_pid_namespace(self) -> bool | None:
        """Says once, in the log and a Node Event, when the agent does not share the node's PID
        namespace (``pidns``): NVML then lists none of the pods' processes, so no overuse is seen."""
        sees = sees_node_pids(self.host_proc)
        if sees is False:
            message = (f"the node agent runs in a PID namespace of its own ({self.host_proc} is the node's /proc"
                       " and its processes differ): NVML lists only the processes the agent can see, so no pod's"
                       " GPU use is measured and no overuse is reported. Run the agent's pod with hostPID: true"
                       " (the DaemonSet's default).")
            log.error("GPU processes of pods are not visible to the agent", node=self.node, problem=message)
            await record_event(self.kube, self.node, node_ref(self.node), "GpuProcessesNotVisible", message)
        elif sees is None:
            log.info("could not tell whether the agent shares the node's PID namespace (--host-proc is no procfs)",
                     node=self.node, host_proc=str(self.host_proc))
        return sees

    async def once(self, now: float) -> NodeUse:
        held = await self.kubelet.list(self.node)
        processes, unread = await self._processes()
        every = self._holdings(held)
        holdings = [h for h in every if h.gpu not in unread]
        cgroups = {p.pid: self._pod_uid(p) for p in processes}
        uids = await self._pod_uids(held, {uid for uid in cgroups.values() if uid}, now)
        by_uid = {uid: pod for pod, uid in uids.items()}
        pod_of_pid = {pid: by_uid[uid] for pid, uid in cgroups.items() if uid in by_uid}
        use = measure(holdings, processes, pod_of_pid)
        started, ended = self.tracker.update(use.pods, now, keep=unread)
        for pod_use in started:
            self._started(pod_use)
        self._reported = {key: said for key, said in self._reported.items() if self.tracker.overusing(*key)}
        kept = {DeviceKey(self.node, h.device, h.share_id or "") for h in every if h.gpu in unread}
        back = {}
        for pod_use in ended:
            back[(pod_use.pod, pod_use.gpu)] = (
                f"pod {pod_use.pod} is back within its {format_bytes(pod_use.allocated)} on GPU {pod_use.gpu}"
                f" (uses {format_bytes(pod_use.used)})")
            log.info("a pod is back within its GPU memory allocation", node=self.node, pod=str(pod_use.pod),
                     gpu=pod_use.gpu)
        await self._mark(use, uids, {h.claim for h in every}, back, kept)
        USE.snapshot = UseSnapshot(
            self.node, use, frozenset((str(u.pod), u.gpu) for u in use.pods if self.tracker.overusing(u.pod, u.gpu)),
            tuple(g.uuid for g in self.gpus if g.uuid not in unread))
        return use

    async def _processes(self) -> tuple[list[GpuProcess], set[str]]:
        """Each GPU's processes, and the GPUs whose could not be read: one GPU that fails (lost, an NVML
        error) leaves the others measured; the pass fails only when none could be read."""
        processes: list[GpuProcess] = []
        unread: dict[str, GpuBackendError] = {}
        for gpu in self.gpus:
            try:
                processes += await asyncio.to_thread(self.backend.processes, gpu)
            except GpuBackendError as error:
                unread[gpu.uuid] = error
        if unread and len(unread) == len(self.gpus):
            raise next(iter(unread.values()))
        for uuid, failure in unread.items():
            (log.debug if uuid in self._unread else log.warning)(
                "could not read a GPU's processes; its pods are not measured this pass (their overuse state is"
                " kept)", node=self.node, gpu=uuid, error=str(failure))
        for uuid in self._unread - set(unread):
            log.info("reading a GPU's processes works again", node=self.node, gpu=uuid)
        self._unread = set(unread)
        return processes, set(unread)

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
            pods = {r["uid"]: r["name"] for r in reserved_for(status) if r["resource"] == "pods" and r["uid"]}
            self._claims[claim] = _ClaimRead(now, pods)
            if claim not in self._marks:  # what an earlier agent of this node left on it
                self._marks[claim] = read_marks(status, self.node)
        for claim in set(self._claims) - claims:
            del self._claims[claim]  # its pods are gone from the node
        uids: dict[PodRef, str] = {}
        for claim, read in self._claims.items():
            namespace = claim.split("/", 1)[0]
            for uid, pod in read.pods.items():
                uids.setdefault(PodRef(namespace, pod), uid)
        return uids

    # Marking

    def _started(self, use: PodGpuUse) -> None:
        log.warning("a pod uses more GPU memory than it was allocated", node=self.node, pod=str(use.pod),
                    gpu=use.gpu, used=use.used, allocated=use.allocated, policy=use.policy)
        self._reported[(use.pod, use.gpu)] = (_now(), describe(use, self.settings.tolerance))
        OVERUSE_ACTIONS.labels(self.node, use.policy, use.pod.namespace, "reported").inc()

    async def _mark(self, use: NodeUse, uids: Mapping[PodRef, str], held: set[str],
                    back: Mapping[tuple[PodRef, str], str], unread: set[DeviceKey]) -> None:
        """Each claim held here says who is over on each of its devices: every pod reported over its
        allocation on the device's GPU (and not yet back), or none. Written only where that changed.
        A pod still over after an agent restart, within the grace, keeps the mark it had; a device on
        a GPU whose processes could not be read this pass (``unread``) keeps its mark as it is."""
        wanted: dict[str, dict[DeviceKey, list[Overuser]]] = {}
        ended: dict[tuple[str, DeviceKey], str] = {}
        for pod_use in use.pods:
            uid, reported = uids.get(pod_use.pod, ""), self._reported.get((pod_use.pod, pod_use.gpu))
            for holding in pod_use.holdings:
                key = DeviceKey(self.node, holding.device, holding.share_id or "")
                devices = wanted.setdefault(holding.claim, {})
                kept = self._marks.get(holding.claim, {}).get(key)
                earlier = next((o for o in (kept.overusers if kept else ()) if o.uid == uid), None)
                if reported is not None and uid:  # since: an earlier agent's, for one overuse
                    since = earlier.since if earlier is not None and earlier.since else reported[0]
                    devices.setdefault(key, []).append(Overuser(uid, pod_use.pod.name, since, reported[1]))
                elif earlier is not None and self.tracker.over(pod_use.pod, pod_use.gpu):
                    devices.setdefault(key, []).append(earlier)
                if (pod_use.pod, pod_use.gpu) in back:
                    ended[(holding.claim, key)] = back[(pod_use.pod, pod_use.gpu)]
        for claim in sorted(held | set(self._marks)):
            current = self._marks.get(claim, {})
            marks = {}
            for key in sorted(set(current) | set(wanted.get(claim, {}))):
                if key in unread:
                    if key in current:
                        marks[key] = current[key]
                    continue
                overusers = tuple(dict.fromkeys(wanted.get(claim, {}).get(key, ())))
                old = current.get(key)
                if not overusers and old is None:
                    continue  # never marked: nothing to say
                message = summary(overusers) if overusers else ended.get(
                    (claim, key), "no pod uses more GPU memory than it was allocated on this device's GPU")
                since = old.since if old is not None and old.over == bool(overusers) and old.since else _now()
                marks[key] = Mark(overusers, message, since)
            if all(mark.same(current.get(key)) for key, mark in marks.items()) and set(marks) == set(current):
                if claim not in held and not any(m.over for m in marks.values()):
                    self._marks.pop(claim, None)  # its pods are gone from the node and nothing is over
                continue
            if await apply_marks(self.kube, self.node, claim, marks):
                self._marks[claim] = marks
            elif claim not in held:
                self._marks.pop(claim, None)  # no pod holds it here now: its mark names none the controller acts on
