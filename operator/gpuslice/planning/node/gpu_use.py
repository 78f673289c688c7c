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
since the kubelet's API names no container ID. A claim shared by several pods is measured per
pod against the whole claim. A process on a GPU that no pod with a gpuslice device there
accounts for (an admin-access container, another driver's, the MPS server itself) is counted as
the GPU's unattributed use.
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


@dataclass
class PodGpuUse:
    """One pod on one GPU: what it was allocated there and what its processes use."""

    pod: PodRef
    gpu: str
    policy: str  # the policy of its largest allocation there
    allocated: int
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


@dataclass(frozen=True)
class NodeUse:
    pods: tuple[PodGpuUse, ...]
    unattributed: Mapping[str, int]  # GPU UUID -> bytes no pod with a gpuslice device there accounts for


def measure(holdings: Iterable[Holding], processes: Iterable[GpuProcess],
            pod_of_pid: Mapping[int, PodRef]) -> NodeUse:
    """Every pod holding devices, on each GPU it holds them on (with no process: used 0, so an idle
    slice is seen), charged with the processes of that pod on that GPU."""
    grouped: dict[tuple[PodRef, str], list[Holding]] = {}
    for holding in holdings:
        grouped.setdefault((holding.pod, holding.gpu), []).append(holding)
    uses: dict[tuple[PodRef, str], PodGpuUse] = {}
    for (pod, gpu), held in sorted(grouped.items(), key=lambda item: (str(item[0][0]), item[0][1])):
        allocations = {h.allocation: h for h in held}
        largest = max(allocations.values(), key=lambda h: (h.allocated, h.policy))
        uses[(pod, gpu)] = PodGpuUse(
            pod=pod, gpu=gpu, policy=largest.policy, allocated=sum(h.allocated for h in allocations.values()),
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
    return NodeUse(tuple(uses.values()), unattributed)


def over(use: PodGpuUse, tolerance: float) -> bool:
    """Whether the pod uses more of the GPU's memory than it was allocated there, beyond ``tolerance``
    (a fraction of the allocation)."""
    return use.used > use.allocated * (1.0 + tolerance)


def tenant_totals(pods: Sequence[PodGpuUse]) -> dict[tuple[str, str], tuple[int, int]]:
    """(policy, namespace) -> (used, allocated) bytes on this node."""
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
    """Who has been over their allocation for long enough to act on (``grace`` seconds: a pod that
    frees what it briefly held is not reported), and who came back under."""

    tolerance: float
    grace: float
    _over: dict[tuple[PodRef, str], _Over] = field(default_factory=dict)

    def update(self, uses: Iterable[PodGpuUse], now: float,
               keep: Collection[str] = ()) -> tuple[list[PodGpuUse], list[PodGpuUse]]:
        """The pods (on a GPU) that have now been over for ``grace`` (reported once), and those
        reported before that are back within their allocation. A pod that is gone is forgotten,
        except on the GPUs of ``keep`` (not measured this time: their processes could not be read)."""
        started, ended, seen = [], [], set()
        for use in uses:
            key = (use.pod, use.gpu)
            seen.add(key)
            state = self._over.get(key)
            if over(use, self.tolerance):
                if state is None:
                    state = self._over[key] = _Over(now)
                if not state.reported and now - state.since >= self.grace:
                    state.reported = True
                    started.append(use)
            elif state is not None:
                del self._over[key]
                if state.reported:
                    ended.append(use)
        for key in set(self._over) - seen:
            if key[1] not in keep:
                del self._over[key]
        return started, ended

    def overusing(self, pod: PodRef, gpu: str) -> bool:
        state = self._over.get((pod, gpu))
        return state is not None and state.reported

    def over(self, pod: PodRef, gpu: str) -> bool:
        """Over its allocation now, reported or still within the grace."""
        return (pod, gpu) in self._over
