"""Defragmentation: the fewest pod moves that make room on one GPU for a pod that waits (pure).

Sliced GPUs fragment: after a day of churn a fleet holds plenty of free memory in small pieces
and a pod that needs a whole GPU (or a large slice) waits, since no single GPU has the room. The
scheduler only places new pods. This planner finds, for each such pod, the GPU that the fewest
moves of *movable* pods (``planning.defrag.facts``) free for it, and says what blocks the others.

Room is the scheduler's arithmetic: a device fits on its GPU when every counter it consumes
(``memory`` of a memory slice or a whole GPU, ``memory-slice-N`` of a MIG placement) is free in
the GPU's counter set. For each GPU that offers a device of the kind the pod asks for, the
planner takes the pods holding devices there, and searches for the smallest set of movable ones
whose devices, once released, cover what is missing: exactly (every set of size k before any of
size k + 1, from a lower bound per counter), falling back to the largest first past a budget of
sets. A set is taken only if every pod in it can be placed again elsewhere, first fit over the
other GPUs as the scheduler does, on a free device of the same kind, and no disruption budget
is exceeded by it. Of the GPUs, the one with the fewest moves wins; ties go to the one moving the
least memory. A pod that waits while a device of its kind is free needs no move (the scheduler
will place it, or something else holds it: ``gpuslice why``); one whose policy's GPUs do not hold
enough free memory even in pieces is not helped by moving anything.

Plans for several waiting pods are made in order of waiting time, each on what the earlier ones
leave: their GPU is taken, and the moved pods' new places are used. Shared-capacity devices are
not defragmented (a shared device cannot be closed to the moved pods and open to the waiting one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from gpuslice.dra.quantity import format_bytes, quantity_bytes
from gpuslice.planning.defrag.facts import Blocker, ClaimFacts, PodFacts, budget_excess, pod_blocker
from gpuslice.planning.defrag.model import Cluster, GpuOption, Move, Plan, Waiting
from gpuslice.planning.defrag.search import Key, fewest
from gpuslice.planning.devices import Device
from gpuslice.planning.reads.node_fit import NodeFacts, refusal
from gpuslice.planning.reads.published import PublishedDevice, gpu_memory


def _amount(text: str) -> int:
    try:
        return quantity_bytes(text)
    except ValueError:
        return 0


def consumption(device: Device) -> dict[Key, int]:
    if device.counter_set is None:
        return {}
    return {(device.counter_set, k): _amount(v) for k, v in device.counters}


@dataclass
class _Dev:
    pub: PublishedDevice
    cons: dict[Key, int]
    taken: bool

    @property
    def usable(self) -> bool:
        """Free, and nothing keeps a new claim off it (a taint, a drain, a held change)."""
        return not self.taken and self.pub.state == "free"


@dataclass
class _Gpu:
    node: str
    uuid: str
    index: int
    capacity: dict[Key, int]
    used: dict[Key, int]
    devices: list[_Dev]
    memory: int
    held: int  # memory the allocated devices stand for
    freeing: str = ""  # being freed for a pod: neither a target nor a place for moved pods
    incoming: int = 0  # devices an earlier plan's moved pods are to take here

    @property
    def label(self) -> str:
        return f"{self.node} GPU {self.index}"

    def fits(self, cons: Mapping[Key, int], used: Mapping[Key, int] | None = None) -> bool:
        used = self.used if used is None else used
        return all(amount <= self.capacity.get(k, 0) - used.get(k, 0) for k, amount in cons.items())

    def deficit(self, cons: Mapping[Key, int]) -> dict[Key, int]:
        return {k: need - (self.capacity.get(k, 0) - self.used.get(k, 0)) for k, need in cons.items()
                if need > self.capacity.get(k, 0) - self.used.get(k, 0)}


def _fleet(cluster: Cluster) -> list[_Gpu]:
    freeing = {(m.node, m.gpu): f"being freed for {m.pod.namespace}/{m.pod.name}" for m in cluster.in_flight}
    gpus = []
    for pool in cluster.pools:
        by_gpu: dict[str, list[PublishedDevice]] = {}
        for device in pool.devices:
            by_gpu.setdefault(device.device.gpu_uuid, []).append(device)
        for uuid, devices in by_gpu.items():
            sets = {d.device.counter_set for d in devices if d.device.counter_set}
            capacity = {(s, k): v for s in sets for k, v in pool.counter_sets.get(s, {}).items()}
            made = [_Dev(d, consumption(d.device), d.allocated) for d in devices]
            used: dict[Key, int] = {}
            for dev in made:
                if dev.taken:
                    for k, v in dev.cons.items():
                        used[k] = used.get(k, 0) + v
            held = sum(_held_memory(d) for d in devices)
            gpus.append(_Gpu(pool.node, uuid, devices[0].device.gpu_index, capacity, used, made,
                             gpu_memory(devices, pool.counter_sets), held, freeing.get((pool.node, uuid), "")))
    return sorted(gpus, key=lambda g: (g.node, g.index))


def _held_memory(device: PublishedDevice) -> int:
    if device.device.traits.consumable:
        return sum(h.memory or 0 for h in device.users)
    return device.device.memory if device.allocated else 0


_Placed = tuple["_Gpu", "_Dev"]  # a moved pod's device, and where it would go


@dataclass
class _Unit:
    """What moves together: one pod and every device its claims hold on the GPU."""

    ref: str
    pod: PodFacts | None
    devices: list[str] = field(default_factory=list)
    cons: dict[Key, int] = field(default_factory=dict)
    memory: int = 0
    kinds: list[_Dev] = field(default_factory=list)
    blocker: Blocker | None = None


class _Planner:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.gpus = _fleet(cluster)
        self.claims = {c.ref: c for c in cluster.claims}
        self.pods = {p.ref: p for p in cluster.pods}

    def _node(self, name: str) -> NodeFacts:
        return self.cluster.nodes.get(name) or NodeFacts(name)

    def _units(self, gpu: _Gpu, policy: str) -> list[_Unit]:
        tenants = self.cluster.tenants.get(policy, frozenset())
        units: dict[str, _Unit] = {}
        for dev in gpu.devices:
            for holder in dev.pub.users:
                claim = self.claims.get(holder.ref)
                pod_ref, pod, blocker = self._holder(holder.ref, holder.namespace, claim, tenants)
                unit = units.setdefault(pod_ref, _Unit(pod_ref, pod, blocker=blocker))
                if pod is not None and unit.blocker is None:
                    unit.blocker = pod_blocker(pod, tenants, self.cluster.opted_out, self.cluster.budgets)
                if pod is not None and unit.blocker is None and claim is not None and claim.selectors:
                    unit.blocker = Blocker("Selectors", pod_ref, f"{pod_ref}'s claim {claim.ref} has CEL selectors,"
                                                                 " which gpuslice does not evaluate: it cannot tell"
                                                                 " where its replacement would go")
                if dev.pub.name not in unit.devices:
                    unit.devices.append(dev.pub.name)
                    unit.kinds.append(dev)
                    unit.memory += (holder.memory or 0) if dev.pub.device.traits.consumable else dev.pub.device.memory
                    for k, v in dev.cons.items():
                        unit.cons[k] = unit.cons.get(k, 0) + v
        return sorted(units.values(), key=lambda u: u.ref)

    def _holder(self, ref: str, namespace: str, claim: ClaimFacts | None,
                tenants: frozenset[str]) -> tuple[str, PodFacts | None, Blocker | None]:
        """The pod that moves to release claim ``ref``, or why none can."""
        if claim is None or not claim.reserved:
            return ref, None, Blocker("NoPod", ref, f"claim {ref} holds a device and no pod uses it: it is released"
                                                    " when deleted (or deallocated)")
        if len(claim.reserved) > 1 or claim.owner_pod is None or claim.owner_pod != claim.reserved[0][1]:
            users = ", ".join(f"{namespace}/{name}" for name, _ in claim.reserved)
            return ref, None, Blocker("StandaloneClaim", ref, f"claim {ref} (used by {users}) was not made for one"
                                                              " pod: moving its pods would not release it")
        name, uid = claim.reserved[0]
        pod_ref = f"{namespace}/{name}"
        pod = self.pods.get(pod_ref)
        if pod is not None and pod.uid == uid:
            return pod_ref, pod, None
        if namespace not in tenants:
            return pod_ref, None, Blocker("NotATenant", pod_ref, f"{pod_ref} is in namespace {namespace}, not a"
                                                                 " tenant of the policy")
        return pod_ref, None, Blocker("NoPod", pod_ref, f"pod {pod_ref} of claim {ref} was not found")

    def _relocate(self, units: Sequence[_Unit], source: _Gpu) -> tuple[dict[str, str], list[_Placed]] | Blocker:
        """Where each unit's devices go (first fit over the other GPUs), or what has no place."""
        used = {id(g): dict(g.used) for g in self.gpus}
        taken: set[int] = set()
        where: dict[str, str] = {}
        placed: list[_Placed] = []
        for unit in sorted(units, key=lambda u: (-u.memory, u.ref)):
            spots = []
            for dev in sorted(unit.kinds, key=lambda d: -d.pub.device.memory):
                spot = self._spot(dev, unit.pod, source, used, taken)
                if spot is None:
                    what = f"{dev.pub.device.kind} of {dev.pub.device.policy}"
                    return Blocker("NowhereToGo", unit.ref, f"{unit.ref} would have nowhere to go: no free {what}"
                                                            " on another GPU")
                gpu, target = spot
                taken.add(id(target))
                for k, v in target.cons.items():
                    used[id(gpu)][k] = used[id(gpu)].get(k, 0) + v
                spots.append(gpu.label)
                placed.append((gpu, target))
            where[unit.ref] = ", ".join(dict.fromkeys(spots))
        return where, placed

    def _spot(self, dev: _Dev, pod: PodFacts | None, source: _Gpu, used: Mapping[int, dict[Key, int]],
              taken: set[int]) -> tuple[_Gpu, _Dev] | None:
        want = (dev.pub.device.policy, dev.pub.device.kind)
        for gpu in self.gpus:
            if gpu is source or gpu.freeing:
                continue
            if pod is not None and refusal(pod.placement, self._node(gpu.node)) is not None:
                continue
            for other in gpu.devices:
                if ((other.pub.device.policy, other.pub.device.kind) == want and other.usable
                        and id(other) not in taken and gpu.fits(other.cons, used[id(gpu)])):
                    return gpu, other
        return None

    def _option(self, gpu: _Gpu, target: _Dev, waiting: Waiting) -> tuple[GpuOption, list[_Placed]]:
        deficit = gpu.deficit(target.cons)
        base = GpuOption(gpu.node, gpu.index, gpu.uuid, target.pub.name)
        units = self._units(gpu, waiting.policy)
        needed = [u for u in units if any(k in deficit for k in u.cons)]
        movable = [u for u in needed if u.blocker is None]
        stuck = [u.blocker for u in needed if u.blocker is not None]
        if any(sum(u.cons.get(k, 0) for u in movable) < missing for k, missing in deficit.items()):
            if not stuck and gpu.incoming:
                stuck = [Blocker("Incoming", gpu.label, f"pods moved by an earlier plan are to take {gpu.incoming}"
                                                        f" devices of {gpu.label}")]
            return replace(base, blockers=tuple(stuck) or (Blocker(
                "Tainted", gpu.label, f"{gpu.label} cannot hold a {waiting.kind} device even empty"),)), []
        found: dict[str, tuple[dict[str, str], list[_Placed]]] = {}
        refusals: list[Blocker] = []

        def feasible(chosen: Sequence[_Unit]) -> bool:
            excess = budget_excess([u.pod for u in chosen if u.pod is not None], self.cluster.budgets)
            if excess is not None:
                refusals.append(excess)
                return False
            placed = self._relocate(chosen, gpu)
            if isinstance(placed, Blocker):
                refusals.append(placed)
                return False
            found[",".join(u.ref for u in chosen)] = placed
            return True

        chosen, exact = fewest(deficit, movable, feasible)
        if chosen is None:
            return replace(base, blockers=tuple(dict.fromkeys(refusals[-1:] + stuck))), []
        where, placed = found[",".join(u.ref for u in chosen)]
        moves = tuple(Move(u.ref, u.pod.uid if u.pod else "", " ".join(u.pod.owner or ()) if u.pod else "",
                           tuple(u.devices), u.memory, where.get(u.ref, "")) for u in chosen)
        return replace(base, moves=moves, exact=exact), placed

    def plan(self, waiting: Waiting) -> Plan:
        def head(verdict: str, message: str, target: GpuOption | None = None,
                 alternatives: tuple[GpuOption, ...] = (), reason: str = "") -> Plan:
            return Plan(waiting.pod.ref, waiting.pod.uid, waiting.claim.ref, waiting.claim.uid, waiting.policy,
                        waiting.kind, waiting.since, verdict, message, target, alternatives, reason)

        flight = next((m for m in self.cluster.in_flight if m.claim.uid == waiting.claim.uid), None)
        if flight is not None:
            return head("InFlight", f"{flight.node} GPU {flight.gpu_index} is being freed for it ({flight.by},"
                                    f" until {flight.expires})")
        if waiting.problem:
            return head("Unsupported", waiting.problem, reason=waiting.code or "Unsupported")
        if waiting.pod.namespace not in self.cluster.tenants.get(waiting.policy, frozenset()):
            return head("Unsupported", f"namespace {waiting.pod.namespace} is not a tenant of {waiting.policy}:"
                                       " no GPU of it would go to this pod", reason="NotATenant")
        offering = [g for g in self.gpus if any(_of_kind(d, waiting) for d in g.devices)]
        refusals = {g.node: why for g in offering if (why := refusal(waiting.pod.placement, self._node(g.node)))}
        candidates = [g for g in offering if g.node not in refusals]
        if not candidates:
            why = f": {next(iter(refusals.values()))}" if refusals else ""
            return head("Unsupported", f"no GPU of {waiting.policy} that the pod may use offers a {waiting.kind}"
                                       f" device{why}", reason="NodeFit" if refusals else "NoDevice")
        candidates = [g for g in candidates if any(_kind_of(d, waiting) for d in g.devices)]
        if not candidates:
            return head("Unsupported", f"a {waiting.kind} device of {waiting.policy} holds more than the"
                                       f" {format_bytes(waiting.memory_left or 0)} left of namespace"
                                       f" {waiting.pod.namespace}'s maxMemory: its claim would be refused",
                        reason="OverMemory")
        if any(d.pub.device.traits.consumable for g in candidates for d in g.devices if _kind_of(d, waiting)):
            return head("Unsupported", "shared-capacity devices are not defragmented: a shared device cannot be"
                                       " closed to the moved pods and open to this one", reason="Shared")
        open_gpus = [g for g in candidates if not g.freeing]
        for gpu in open_gpus:
            fits = [d for d in gpu.devices if _kind_of(d, waiting) and d.usable and gpu.fits(d.cons)]
            if fits:
                return head("NotNeeded", f"{fits[0].pub.name} on {gpu.label} is free and fits: the scheduler can"
                                         " place it (gpuslice why says what else it waits for)")
        need = max(d.pub.device.memory for g in candidates for d in g.devices if _kind_of(d, waiting))
        free = sum(max(0, g.memory - g.held) for g in open_gpus)
        if free < need:
            return head("NoRoom", f"the GPUs of {waiting.policy} it may use hold {format_bytes(free)} free in all,"
                                  f" less than the {format_bytes(need)} it needs: moving pods cannot make room")
        options: list[tuple[GpuOption, list[_Placed], _Gpu, _Dev]] = []
        for gpu in candidates:
            if gpu.freeing:
                options.append((GpuOption(gpu.node, gpu.index, gpu.uuid, blockers=(
                    Blocker("InFlight", gpu.label, f"{gpu.label} is {gpu.freeing}"),)), [], gpu, gpu.devices[0]))
                continue
            best: tuple[GpuOption, list[_Placed], _Gpu, _Dev] | None = None
            seen: set[tuple[tuple[Key, int], ...]] = set()
            targets = [d for d in gpu.devices if _kind_of(d, waiting)]
            for target in targets:
                signature = tuple(sorted(target.cons.items()))
                if not target.usable or signature in seen:
                    continue
                seen.add(signature)
                option, placed = self._option(gpu, target, waiting)
                if best is None or _rank(option) < _rank(best[0]):
                    best = (option, placed, gpu, target)
            if best is None:
                reasons = sorted({r for d in targets for r in (d.pub.reasons or (d.pub.state,))})
                options.append((GpuOption(gpu.node, gpu.index, gpu.uuid, blockers=(Blocker(
                    "Tainted", gpu.label, f"its {waiting.kind} devices are kept off: {', '.join(reasons)}"),)),
                    [], gpu, targets[0]))
            else:
                options.append(best)
        options.sort(key=lambda o: _rank(o[0]))
        chosen, placed, gpu, target = options[0]
        others = tuple(o[0] for o in options[1:])
        if chosen.blockers:
            return head("Blocked", "every GPU that could hold it is blocked",
                        alternatives=tuple(o[0] for o in options))
        self._commit(gpu, target, chosen, placed, waiting)
        return head("Ready", _summary(chosen, others), target=chosen, alternatives=others)

    def _commit(self, gpu: _Gpu, target: _Dev, option: GpuOption, placed: list[_Placed],
                waiting: Waiting) -> None:
        """What the next plans see: this GPU taken, the moved pods in their new places."""
        moved = {name for m in option.moves for name in m.devices}
        for dev in gpu.devices:
            if dev.pub.name in moved:
                dev.taken = False
                for k, v in dev.cons.items():
                    gpu.used[k] -= v
        target.taken = True
        for k, v in target.cons.items():
            gpu.used[k] = gpu.used.get(k, 0) + v
        gpu.freeing = f"planned for {waiting.pod.ref}"
        for other, dev in placed:
            dev.taken = True
            other.incoming += 1
            other.held += dev.pub.device.memory
            for k, v in dev.cons.items():
                other.used[k] = other.used.get(k, 0) + v


def _of_kind(dev: _Dev, waiting: Waiting) -> bool:
    return dev.pub.device.policy == waiting.policy and dev.pub.device.kind == waiting.kind


def _kind_of(dev: _Dev, waiting: Waiting) -> bool:
    """A device of the kind the waiting claim asks for, that its maxMemory has room for."""
    return (dev.pub.device.policy == waiting.policy and dev.pub.device.kind == waiting.kind
            and (waiting.memory_left is None or dev.pub.device.memory <= waiting.memory_left))


def _rank(option: GpuOption) -> tuple[int, int, int, str, int]:
    return (1 if option.blockers else 0, len(option.moves), option.memory_moved, option.node, option.index)


def _summary(chosen: GpuOption, others: Sequence[GpuOption]) -> str:
    moves = len(chosen.moves)
    text = f"frees {chosen.label} by moving {moves} pod{'s' if moves != 1 else ''}"
    feasible = [o for o in others if not o.blockers]
    if feasible:
        text += f" (the fewest: the next best, {feasible[0].label}, needs {len(feasible[0].moves)})"
    return text


def plan_defrag(cluster: Cluster, waiting: Sequence[Waiting]) -> list[Plan]:
    """A plan for each waiting pod, oldest first, each made on what the earlier ones leave."""
    planner = _Planner(cluster)
    return [planner.plan(w) for w in sorted(waiting, key=lambda w: (w.since, w.pod.ref))]
