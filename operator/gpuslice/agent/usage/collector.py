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
5. ``planning.node.gpu_use.measure`` and the overuse tracker; metrics (``metrics``) and, for a claim
   whose pods (every pod that shares it) use more than it was allocated, beyond the tolerance for the
   grace, a mark on it naming each of its pods and the ones to evict (``actions``), which the
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
from gpuslice.agent.node_state.checkpoint import ClaimCheckpoint, PreparedDevice
from gpuslice.agent.usage.actions import apply_marks
from gpuslice.agent.usage.metrics import USAGE_PASSES, USE, UseSnapshot
from gpuslice.agent.usage.pidns import sees_node_pids
from gpuslice.agent.usage.podresources import HeldDevice, PodResources, PodResourcesError
from gpuslice.coordinates import claim_path
from gpuslice.dra.quantity import format_bytes
from gpuslice.dra.wire import reserved_for
from gpuslice.inventory.gpus import Gpu
from gpuslice.kube.client import KubeClient, KubeError
from gpuslice.observability.metrics import OVERUSE_ACTIONS
from gpuslice.planning.node.gpu_use import (
    Allocation,
    ClaimUse,
    Holding,
    NodeUse,
    OveruseTracker,
    PodGpuUse,
    PodRef,
    measure,
    parse_cgroup,
    to_evict,
)
from gpuslice.planning.overuse import DeviceKey, Mark, Overuser, read_marks, summary

log = structlog.get_logger(__name__)
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


@dataclass(frozen=True)
class _Named:
    """A pod of an overused claim as this agent names it in the claim's mark."""

    since: str
    message: str
    evict: bool


def describe(claim: ClaimUse, use: PodGpuUse, tolerance: float, evict: bool) -> str:
    """The agent's words on one pod of an overused claim (the controller's Event on the pod says them)."""
    where = f" (container {use.container})" if use.container else ""
    head = f"pod {use.pod}{where} uses {format_bytes(use.used)} of GPU memory on GPU {claim.gpu}"
    terms = f"(policy {claim.policy}, tolerance {tolerance:.0%})"
    neighbours = "its neighbours on the GPU may fail to allocate"
    if len(claim.pods) == 1:
        return (f"{head}, more than the {format_bytes(claim.allocated)} its claims ({', '.join(claim.claims)}) were"
                f" allocated there {terms}; {neighbours}")
    others = len(claim.pods) - 1
    return (f"{head}; with the {others} other pod{'s' if others > 1 else ''} sharing its claims"
            f" ({', '.join(claim.claims)}) that is {format_bytes(claim.used)}, more than the"
            f" {format_bytes(claim.allocated)} they were allocated there {terms}; under onOveruse: Evict the largest"
            f" users go until the rest fit: {'this pod is one of them' if evict else 'not this pod, as things stand'};"
            f" {neighbours}")


def back_within(claim: ClaimUse) -> str:
    if len(claim.pods) == 1:
        return (f"pod {claim.pods[0].pod} is back within its {format_bytes(claim.allocated)} on GPU {claim.gpu}"
                f" (uses {format_bytes(claim.used)})")
    return (f"the pods of claims {', '.join(claim.claims)} ({', '.join(p.pod.name for p in claim.pods)}) are back"
            f" within their {format_bytes(claim.allocated)} on GPU {claim.gpu} (use {format_bytes(claim.used)})")


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
    _named: dict[tuple[PodRef, str], _Named] = field(default_factory=dict)  # (pod, GPU) of overused claims ->
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
        started, ended = self.tracker.update(use.claims, now, keep=unread)
        for claim_use in started:
            self._started(claim_use)
        self._name(use, uids, unread)
        kept = {DeviceKey(self.node, h.device, h.share_id or "") for h in every if h.gpu in unread}
        back = {}
        for claim_use in ended:
            back[(claim_use.gpu, claim_use.allocations)] = back_within(claim_use)
            log.info("a claim's pods are back within its GPU memory allocation", node=self.node,
                     claims=list(claim_use.claims), pods=[str(p.pod) for p in claim_use.pods], gpu=claim_use.gpu)
        await self._mark(use, uids, {h.claim for h in every}, back, kept)
        USE.snapshot = UseSnapshot(
            self.node, use, frozenset((str(p.pod), c.gpu) for c in use.claims if self.tracker.overusing(c)
                                      for p in c.pods),
            tuple(g.uuid for g in self.gpus if g.uuid not in unread))
        return use

    def _name(self, use: NodeUse, uids: Mapping[PodRef, str], unread: set[str]) -> None:
        """Each pod of a reported claim, as the mark will name it: since when (kept while it is named),
        the agent's words, and whether it is one to evict (a choice kept while its pod is there, also
        one an earlier agent of this node made)."""
        named = {key: said for key, said in self._named.items() if key[1] in unread}
        for claim in use.claims:
            if not self.tracker.overusing(claim):
                continue
            chosen = {p.pod for p in claim.pods if self._chosen(p, claim.gpu, uids.get(p.pod, ""))}
            going = set(to_evict(claim, self.settings.tolerance, chosen))
            for pod in claim.pods:
                earlier = self._named.get((pod.pod, claim.gpu))
                evict = pod.pod in going
                named[(pod.pod, claim.gpu)] = _Named(earlier.since if earlier is not None else _now(),
                                                     describe(claim, pod, self.settings.tolerance, evict), evict)
        self._named = named

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
        (at most every REREAD seconds) when a process names a UID none of the claims named, and at once
        when the kubelet says a pod holds it that it did not name (a pod that joined a shared claim: its
        use counts towards the claim from its first pass, not REREAD seconds later)."""
        known = {uid for read in self._claims.values() for uid in read.pods}
        unknown = bool(seen - known)
        claims = {d.claim for d in held}
        holders: dict[str, set[str]] = {}
        for device in held:
            holders.setdefault(device.claim, set()).add(device.pod.name)
        for claim in sorted(claims):
            read = self._claims.get(claim)
            if read is not None and not (unknown and now - read.at >= REREAD) and holders[claim] <= set(
                    read.pods.values()):
                continue
            namespace, name = claim.split("/", 1)
            try:
                body = await self.kube.get(claim_path(namespace, name))
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

    def _chosen(self, use: PodGpuUse, gpu: str, uid: str) -> bool:
        earlier = self._named.get((use.pod, gpu))
        if earlier is not None:
            return earlier.evict
        marks = [self._marks.get(h.claim, {}).get(DeviceKey(self.node, h.device, h.share_id or ""))
                 for h in use.holdings]
        return bool(uid) and any(o.uid == uid and o.evict for m in marks if m is not None for o in m.overusers)

    def _started(self, use: ClaimUse) -> None:
        log.warning("a claim's pods use more GPU memory than it was allocated", node=self.node,
                    claims=list(use.claims), pods={str(p.pod): p.used for p in use.pods}, gpu=use.gpu, used=use.used,
                    allocated=use.allocated, policy=use.policy)
        OVERUSE_ACTIONS.labels(self.node, use.policy, use.pods[0].pod.namespace, "reported").inc()

    async def _mark(self, use: NodeUse, uids: Mapping[PodRef, str], held: set[str],
                    back: Mapping[tuple[str, frozenset[Allocation]], str], unread: set[DeviceKey]) -> None:
        """Each claim held here says who is over on each of its devices: every pod holding it there
        while its pods are reported over its allocation on the device's GPU (and not yet back), or
        none. Written only where that changed. A pod still over after an agent restart, within the
        grace, keeps the mark it had (its choice for eviction too); a device on a GPU whose processes
        could not be read this pass (``unread``) keeps its mark as it is."""
        wanted: dict[str, dict[DeviceKey, list[Overuser]]] = {}
        ended: dict[tuple[str, DeviceKey], str] = {}
        for claim_use in use.claims:
            over = self.tracker.over(claim_use)
            for pod_use in claim_use.pods:
                uid, named = uids.get(pod_use.pod, ""), self._named.get((pod_use.pod, claim_use.gpu))
                for holding in pod_use.holdings:
                    key = DeviceKey(self.node, holding.device, holding.share_id or "")
                    devices = wanted.setdefault(holding.claim, {})
                    kept = self._marks.get(holding.claim, {}).get(key)
                    earlier = next((o for o in (kept.overusers if kept else ()) if o.uid == uid), None)
                    if named is not None and uid:  # since and the choice: an earlier agent's, for one overuse
                        since = earlier.since if earlier is not None and earlier.since else named.since
                        devices.setdefault(key, []).append(Overuser(uid, pod_use.pod.name, since, named.message,
                                                                    named.evict))
                    elif earlier is not None and over:
                        devices.setdefault(key, []).append(earlier)
                    if (claim_use.gpu, claim_use.allocations) in back:
                        ended[(holding.claim, key)] = back[(claim_use.gpu, claim_use.allocations)]
        for claim in sorted(held | set(self._marks)):
            current = self._marks.get(claim, {})
            marks = {}
            for key in sorted(set(current) | set(wanted.get(claim, {}))):
                if key in unread:
                    if key in current:
                        marks[key] = current[key]
                    continue
                overusers = tuple(sorted(dict.fromkeys(wanted.get(claim, {}).get(key, ())),
                                         key=lambda o: (not o.evict, o.name)))  # the message speaks of one to go
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
