"""Each pod's real GPU use against what it was allocated, and who uses more than that (pure).

The node agent gathers three views of its node (``agent.usage``) and this module joins them:

- **holdings**: which container of which pod holds which gpuslice device, as the kubelet says
  (its PodResources API), each with the GPU it is on, its policy and the memory it was
  allocated (the claim's checkpoint: a slice's size, or a shared device's consumed capacity);
- **processes**: what runs on each GPU and how much memory it has (NVML, per process);
- **pod identities**: which pod a process belongs to (its cgroup names the pod's UID; the
  claims' ``status.reservedFor`` turns the UID into the pod's namespace and name).

Granularity: a process is charged to its **pod**, on the GPU it runs on. When one container of
the pod holds the pod's devices on that GPU, the use is that container's as well; when several
do (one claim shared by two containers), the pod is the finest unit that can be told apart,
since the kubelet's API names no container ID. A process on a GPU that no pod with a gpuslice
device there accounts for (an admin-access container, another driver's, the MPS server itself)
is counted as the GPU's unattributed use.

Overuse is judged per **claim** on a GPU (:class:`ClaimUse`), never per pod: a claim that several
pods share was allocated once (the scheduler and the maxMemory webhook count it once), so its
pods together may use what it holds, and no more. Pods are bound together with every allocation
any of them holds on the GPU (a pod holding two claims there, one of them shared, cannot say
which of its bytes are whose), so the unit is the connected set of pods and allocations; for the
usual pod with a claim of its own it is that pod and that claim.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

# The pod's UID in a container's cgroup path, in both the cgroupfs driver's form
# (.../pod1b2c3d4e-...-.../<container>) and the systemd driver's (...-pod1b2c3d4e_..._....slice/...).
_POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
_CONTAINER = re.compile(r"(?:^|[-/])([0-9a-f]{64})(?:\.scope)?$")


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Holding:
    """One device a container of a pod holds, and what its claim was allocated of it."""

    pod: PodRef
    container: str
    claim: str  # the claim's namespace/name
    device: str
    share_id: str | None
    gpu: str  # the GPU's UUID
    policy: str
    allocated: int  # bytes

    @property
    def allocation(self) -> tuple[str, str, str | None]:
        """What the claim holds, once however many containers share it."""
        return (self.claim, self.device, self.share_id)


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    gpu: str  # the GPU's UUID
    used: int  # bytes of device memory
    sm: float | None = None  # share of the GPU's SMs it kept busy lately, 0..1 (None: not reported)


@dataclass(frozen=True)
class Cgroup:
    pod_uid: str
    container_id: str | None


def parse_cgroup(text: str) -> Cgroup | None:
    """The pod (and container) a process belongs to, from its ``/proc/<pid>/cgroup``; None for a
    process outside any pod (a host daemon, the MPS server the agent started)."""
    for line in text.splitlines():
        path = line.rsplit(":", 1)[-1]
        found = _POD_UID.search(path)
        if found is not None:
            container = _CONTAINER.search(path)
            return Cgroup(found.group(1).replace("_", "-"), container.group(1) if container else None)
    return None


Allocation = tuple[str, str, str | None]  # (claim, device, share id): what a claim holds, once


@dataclass
class PodGpuUse:
    """One pod on one GPU: its share of what it holds there and what its processes use."""

    pod: PodRef
    gpu: str
    policy: str  # the policy of its largest allocation there
    allocated: int  # its share: each allocation it holds, split evenly among the pods that hold it
    containers: tuple[str, ...]  # the containers holding its devices on this GPU
    claims: tuple[str, ...]
    holdings: tuple[Holding, ...]
    used: int = 0
    sm: float = 0.0
    pids: list[int] = field(default_factory=list)

    @property
    def container(self) -> str:
        """The container the use is of, when one container holds the pod's devices here; else ''."""
        return self.containers[0] if len(self.containers) == 1 else ""

    @property
    def allocations(self) -> frozenset[Allocation]:
        return frozenset(h.allocation for h in self.holdings)


@dataclass(frozen=True)
class ClaimUse:
    """A claim on one GPU and every pod that shares it (with whatever else those pods hold there):
    what was allocated, counted once, against what all of them use. The unit overuse is judged on."""

    gpu: str
    allocations: frozenset[Allocation]
    allocated: int
    policy: str  # of its largest allocation
    pods: tuple[PodGpuUse, ...]  # by name

    @property
    def used(self) -> int:
        return sum(p.used for p in self.pods)

    @property
    def claims(self) -> tuple[str, ...]:
        return tuple(sorted({claim for claim, _, _ in self.allocations}))


@dataclass(frozen=True)
class NodeUse:
    pods: tuple[PodGpuUse, ...]
    unattributed: Mapping[str, int]  # GPU UUID -> bytes no pod with a gpuslice device there accounts for
    claims: tuple[ClaimUse, ...] = ()


def measure(holdings: Iterable[Holding], processes: Iterable[GpuProcess],
            pod_of_pid: Mapping[int, PodRef]) -> NodeUse:
    """Every pod holding devices, on each GPU it holds them on (with no process: used 0, so an idle
    slice is seen), charged with the processes of that pod on that GPU; and each claim there with
    the pods that share it."""
    grouped: dict[tuple[PodRef, str], list[Holding]] = {}
    holders: dict[Allocation, set[PodRef]] = {}
    for holding in holdings:
        grouped.setdefault((holding.pod, holding.gpu), []).append(holding)
        holders.setdefault(holding.allocation, set()).add(holding.pod)
    uses: dict[tuple[PodRef, str], PodGpuUse] = {}
    for (pod, gpu), held in sorted(grouped.items(), key=lambda item: (str(item[0][0]), item[0][1])):
        allocations = {h.allocation: h for h in held}
        largest = max(allocations.values(), key=lambda h: (h.allocated, h.policy))
        share = sum(_share(h.allocated, sorted(holders[a], key=str), pod) for a, h in allocations.items())
        uses[(pod, gpu)] = PodGpuUse(
            pod=pod, gpu=gpu, policy=largest.policy, allocated=share,
            containers=tuple(sorted({h.container for h in held})), claims=tuple(sorted({h.claim for h in held})),
            holdings=tuple(held))
    unattributed: dict[str, int] = {}
    for process in processes:
        owner = pod_of_pid.get(process.pid)
        use = uses.get((owner, process.gpu)) if owner is not None else None
        if use is None:
            unattributed[process.gpu] = unattributed.get(process.gpu, 0) + process.used
            continue
        use.used += process.used
        use.sm = min(1.0, use.sm + (process.sm or 0.0))
        use.pids.append(process.pid)
    return NodeUse(tuple(uses.values()), unattributed, _claims(uses.values()))


def _share(allocated: int, pods: Sequence[PodRef], pod: PodRef) -> int:
    """The pod's even share of an allocation its ``pods`` hold together; the first pods by name take a
    byte each of the remainder, so the shares add up to the allocation."""
    whole, remainder = divmod(allocated, len(pods))
    return whole + (1 if pods.index(pod) < remainder else 0)


def _claims(pods: Iterable[PodGpuUse]) -> tuple[ClaimUse, ...]:
    """The pods of each GPU bound together by the allocations they hold (union-find over both)."""
    parent: dict[object, object] = {}

    def root(node: object) -> object:
        while parent.setdefault(node, node) != node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    pods = list(pods)
    for use in pods:
        for allocation in use.allocations:
            parent[root((use.gpu, allocation))] = root((use.pod, use.gpu))
    members: dict[object, list[PodGpuUse]] = {}
    for use in pods:
        members.setdefault(root((use.pod, use.gpu)), []).append(use)
    found = []
    for group in members.values():
        held = {h.allocation: h for use in group for h in use.holdings}
        largest = max(held.values(), key=lambda h: (h.allocated, h.policy))
        found.append(ClaimUse(group[0].gpu, frozenset(held), sum(h.allocated for h in held.values()), largest.policy,
                              tuple(sorted(group, key=lambda u: str(u.pod)))))
    return tuple(sorted(found, key=lambda c: (c.gpu, c.claims, str(c.pods[0].pod))))


def over(use: ClaimUse, tolerance: float) -> bool:
    """Whether the claim's pods together use more of the GPU's memory than it was allocated there,
    beyond ``tolerance`` (a fraction of the allocation)."""
    return use.used > use.allocated * (1.0 + tolerance)


def to_evict(use: ClaimUse, tolerance: float, chosen: Collection[PodRef] = ()) -> tuple[PodRef, ...]:
    """The pods of an overused claim that ``onOveruse: Evict`` evicts: those ``chosen`` before (an
    evicted pod's processes use the GPU until it has stopped, so a choice is never taken back while
    its pod is there), then the largest users first (ties: by name) until what the rest use fits the
    allocation within ``tolerance``. The fewest evictions that end the overuse, whichever pod came
    last; a pod that uses nothing is never chosen, as evicting it would free nothing."""
    going = [p for p in use.pods if p.pod in chosen]
    left = sorted((p for p in use.pods if p.pod not in chosen), key=lambda p: (-p.used, str(p.pod)))
    budget = use.allocated * (1.0 + tolerance)
    while left and left[0].used > 0 and sum(p.used for p in left) > budget:
        going.append(left.pop(0))
    return tuple(p.pod for p in going)


def tenant_totals(pods: Sequence[PodGpuUse]) -> dict[tuple[str, str], tuple[int, int]]:
    """(policy, namespace) -> (used, allocated) bytes on this node (a shared claim counted once)."""
    totals: dict[tuple[str, str], tuple[int, int]] = {}
    for use in pods:
        used, allocated = totals.get((use.policy, use.pod.namespace), (0, 0))
        totals[(use.policy, use.pod.namespace)] = (used + use.used, allocated + use.allocated)
    return totals


@dataclass
class _Over:
    since: float
    reported: bool = False


@dataclass
class OveruseTracker:
    """Which claims have been over their allocation for long enough to act on (``grace`` seconds: use
    briefly held and freed is not reported), and which came back under. Kept per allocation, so that
    a claim keeps its state when a pod joins it or leaves, even one that binds it to another."""

    tolerance: float
    grace: float
    _over: dict[tuple[str, Allocation], _Over] = field(default_factory=dict)  # (GPU, allocation) ->

    def update(self, uses: Iterable[ClaimUse], now: float,
               keep: Collection[str] = ()) -> tuple[list[ClaimUse], list[ClaimUse]]:
        """The claims that have now been over for ``grace`` (reported once), and those reported before
        that are back within their allocation. A claim that is gone is forgotten, except on the GPUs
        of ``keep`` (not measured this time: their processes could not be read)."""
        started, ended, seen = [], [], set()
        for use in uses:
            keys = [(use.gpu, a) for a in use.allocations]
            seen.update(keys)
            states = [s for k in keys if (s := self._over.get(k)) is not None]
            if over(use, self.tolerance):
                state = _Over(min((s.since for s in states), default=now), any(s.reported for s in states))
                if not state.reported and now - state.since >= self.grace:
                    state.reported = True
                    started.append(use)
                for key in keys:
                    self._over[key] = state
            elif states:
                for key in keys:
                    self._over.pop(key, None)
                if any(s.reported for s in states):
                    ended.append(use)
        for key in set(self._over) - seen:
            if key[0] not in keep:
                del self._over[key]
        return started, ended

    def overusing(self, use: ClaimUse) -> bool:
        """Reported over its allocation, and not back yet."""
        return any(s.reported for a in use.allocations if (s := self._over.get((use.gpu, a))) is not None)

    def over(self, use: ClaimUse) -> bool:
        """Over its allocation now, reported or still within the grace."""
        return any((use.gpu, a) in self._over for a in use.allocations)
