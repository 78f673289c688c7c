"""The GPU occupancy map: which tenant holds which part of which GPU (pure).

One bar per GPU, its memory cut into segments, each one of:

- ``allocated``: a claim holds it (tenant namespace, claim, pod);
- ``held``: a claim holds it and a policy change waits for it to be released;
- ``draining``: free, and about to change or go (no new claim lands on it);
- ``tainted``: a taint keeps new claims off it (unhealthy, reconfiguring, mig-failed, or a
  policy's own taint such as maintenance), whoever holds it;
- ``free``: a tenant's claim could get it now;

(an allocated segment whose holder the node agent found using more than it was allocated, its
``GpuMemoryOveruse`` condition, is drawn over-full: ``GpuMap.overusing``);
- ``slack``: memory no device of any policy can use (an H100's 81,559 MiB holds seven 10Gi
  slices; the rest is slack).

Memory-mode slices are not placed anywhere on a GPU (a counter set only keeps their sum within
it), so the bar shows what is held first, then the free memory cut into the GPU's slices. MIG
devices are placed: their bar is the GPU's eight memory slices, each placement where NVML puts
it. A shared device is cut by what each claim consumed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Literal

from gpuslice.dra.quantity import format_bytes
from gpuslice.inventory.catalog import MEMORY_SLICES
from gpuslice.planning.reads.published import DeviceState, Holder, Pool, PublishedDevice, gpu_memory

SegmentState = DeviceState | Literal["slack"]
STATES: tuple[SegmentState, ...] = ("allocated", "held", "draining", "tainted", "free", "slack")


@dataclass(frozen=True)
class Segment:
    """A part of one GPU's bar. ``span`` is the GPU memory it covers on the bar; ``memory`` what
    the device or allocation stands for (a MIG instance has a little less than its slices)."""

    state: SegmentState
    span: int
    memory: int
    policy: str | None = None
    kind: str | None = None  # slice, full, shared or a MIG profile
    devices: tuple[str, ...] = ()
    holder: Holder | None = None
    reasons: tuple[str, ...] = ()  # why tainted: "unhealthy: XID-79", "maintenance: planned"
    placement: tuple[int, int] | None = None  # MIG: (first memory slice, memory slices)
    fits: tuple[str, ...] = ()  # free space: what a claim could get there, e.g. "3 x 20G of training"


@dataclass(frozen=True)
class GpuMap:
    node: str
    uuid: str
    index: int
    product: str
    memory: int
    mode: str
    policies: tuple[str, ...]
    segments: tuple[Segment, ...]
    devices: tuple[PublishedDevice, ...]
    admin: tuple[Holder, ...] = ()  # adminAccess claims: they see the GPU and take none of it
    offers: tuple[str, ...] = ()  # what else a claim could get here now, e.g. "the whole GPU (inference)"
    freeing: str = ""  # being freed for a waiting pod (defragmentation): for whom, by whom, until when

    def bytes_in(self, *states: SegmentState) -> int:
        return sum(s.span for s in self.segments if s.state in states)

    @property
    def overusing(self) -> tuple[Holder, ...]:
        """Holders the node agent found using more of the GPU's memory than they were allocated."""
        found = {s.holder for s in self.segments if s.holder is not None and s.holder.overuse}
        return tuple(sorted(found, key=_order))

    @property
    def tainted_reasons(self) -> tuple[str, ...]:
        """Reasons shared by every device of the GPU: the GPU's own state (unhealthy, reconfiguring)."""
        sets = [set(d.reasons) for d in self.devices]
        common = set.intersection(*sets) if sets else set()
        return tuple(sorted(common))


@dataclass(frozen=True)
class NodeMap:
    name: str
    gpus: tuple[GpuMap, ...]
    complete: bool = True  # False while the agent is rewriting the pool (the scheduler waits too)
    generation: int = 0
    gpus_without_devices: int = 0  # GPUs the node's labels count that publish no device


@dataclass(frozen=True)
class OccupancyMap:
    nodes: tuple[NodeMap, ...] = field(default_factory=tuple)

    @property
    def gpus(self) -> list[GpuMap]:
        return [g for n in self.nodes for g in n.gpus]


def _order(holder: Holder) -> tuple[str, str]:
    return holder.namespace, holder.claim


def _segment_of(device: PublishedDevice, holder: Holder | None, span: int, memory: int,
                placement: tuple[int, int] | None = None) -> Segment:
    state: SegmentState = device.state
    if holder is None and state in ("allocated", "held"):
        state = "free"  # the free part of a shared device someone else holds part of
    return Segment(state, span, memory, device.device.policy, device.device.kind, (device.name,), holder,
                   device.reasons, placement)


def _count(n: int, what: str) -> str:
    return f"{n} x {what}" if n != 1 else f"1 x {what}"


def _memory_gpu(devices: Sequence[PublishedDevice], total: int) -> tuple[list[Segment], list[str]]:
    """Memory mode: held devices first, then the free memory cut into the GPU's slices."""
    segments: list[Segment] = []
    held = [d for d in devices if d.allocated]
    for device in sorted(held, key=lambda d: (min(map(_order, d.users)), d.name)):
        segments.append(_segment_of(device, device.users[0], device.device.memory, device.device.memory))
    left = max(0, total - sum(s.span for s in segments))
    idle = [d for d in devices if not d.allocated and d.device.kind == "slice"]
    groups: dict[tuple[str, int], list[PublishedDevice]] = defaultdict(list)
    for device in idle:
        groups[(device.device.policy, device.device.memory)].append(device)
    offers: list[str] = []
    if groups:
        # Cut the free memory into the slices most devices of the GPU are: one policy's size.
        (policy, size), cells = max(groups.items(), key=lambda item: (len(item[1]), -item[0][1], item[0][0]))
        cells.sort(key=lambda d: (STATES.index(d.state), d.name))  # free ones first, then the others
        cells = sorted(cells[:left // size], key=lambda d: (d.state != "free", d.name))
        for device in cells:
            segments.append(_segment_of(device, None, size, size))
        left -= size * len(cells)
        others = [(p, s, len(ds)) for (p, s), ds in groups.items() if (p, s) != (policy, size)]
        fits = tuple(f"{_count(min(n, left // s), _size(s))} of {p}" for p, s, n in sorted(others) if left // s)
        if left:
            segments.append(Segment("free" if fits else "slack", left, left, fits=fits))
    elif left:
        segments.append(Segment("slack", left, left))
    full = [d for d in devices if d.device.kind == "full" and not d.allocated and d.state == "free"]
    if full and not held:
        offers += [f"the whole GPU ({d.device.policy})" for d in full]
    return segments, offers


def _shared_gpu(devices: Sequence[PublishedDevice], total: int) -> tuple[list[Segment], list[str]]:
    """Shared mode: each claim's consumed capacity, then the rest in steps of sliceSize."""
    segments: list[Segment] = []
    for device in devices:
        step = device.step
        for holder in sorted(device.users, key=_order):
            used = holder.memory if holder.memory is not None else step
            segments.append(_segment_of(device, holder, used, used))
        left = max(0, total - sum(s.span for s in segments))
        if step:
            segments += [_segment_of(device, None, step, step) for _ in range(left // step)]
            left -= step * (left // step)
        if left:
            segments.append(Segment("slack", left, left))
    return segments, []


def _mig_gpu(devices: Sequence[PublishedDevice], total: int) -> tuple[list[Segment], list[str]]:
    """MIG: the GPU's eight memory slices, each placement where it sits."""
    unit = total // MEMORY_SLICES
    segments: list[Segment] = []
    taken: set[int] = set()
    placed = [d for d in devices if d.device.placement is not None]
    for device in sorted((d for d in placed if d.allocated), key=lambda d: d.device.placement or (0, 0)):
        start, size = device.device.placement or (0, 0)
        taken |= set(range(start, start + size))
        segments.append(_segment_of(device, device.users[0], unit * size, device.device.memory, (start, size)))
    idle = [d for d in placed if not d.allocated]
    cells = [set(range(s, s + n)) for d in idle for s, n in [d.device.placement or (0, 0)]]
    static = all(a.isdisjoint(b) for i, a in enumerate(cells) for b in cells[i + 1:])
    if static:  # a layout: each instance is a segment of its own
        for device in idle:
            start, size = device.device.placement or (0, 0)
            if not taken & set(range(start, start + size)):
                taken |= set(range(start, start + size))
                segments.append(_segment_of(device, None, unit * size, device.device.memory, (start, size)))
    for start, size in _runs(set(range(MEMORY_SLICES)) - taken):
        inside = [d for d in idle if (p := d.device.placement) and start <= p[0] and p[0] + p[1] <= start + size]
        usable = sorted({d.device.kind for d in inside if d.state == "free"})
        reasons = tuple(sorted({r for d in inside for r in d.reasons}))
        state: SegmentState = "free" if usable else ("tainted" if reasons else (
            "draining" if any(d.state == "draining" for d in inside) else "slack"))
        segments.append(Segment(state, unit * size, unit * size, policy=inside[0].device.policy if inside else None,
                                devices=tuple(d.name for d in inside), reasons=reasons, placement=(start, size),
                                fits=tuple(usable)))
    segments.sort(key=lambda s: s.placement or (0, 0))
    return segments, []


def _runs(free: set[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for index in sorted(free):
        if runs and runs[-1][0] + runs[-1][1] == index:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((index, 1))
    return runs


def _size(value: int) -> str:
    return format_bytes(value)


def gpu_map(node: str, devices: Sequence[PublishedDevice], counter_sets: Mapping[str, Mapping[str, int]]) -> GpuMap:
    first = devices[0].device
    total = gpu_memory(devices, counter_sets)
    modes = sorted({d.device.mode for d in devices})
    mode = modes[0] if len(modes) == 1 else "+".join(modes)
    # A GPU of one mode is cut as its devices are; mixed modes (a transition) as memory slices.
    traits = {d.device.traits for d in devices}
    only = next(iter(traits)) if len(traits) == 1 else None
    cut = _mig_gpu if only and only.instances else _shared_gpu if only and only.consumable else _memory_gpu
    segments, offers = cut(devices, total)
    admin = tuple(sorted({h for d in devices for h in d.holders if h.admin}, key=_order))
    return GpuMap(node, first.gpu_uuid, first.gpu_index, first.product_name, total, mode,
                  tuple(sorted({d.device.policy for d in devices})), tuple(segments), tuple(devices), admin,
                  tuple(offers))


def occupancy(pools: Iterable[Pool], gpu_counts: Mapping[str, int] | None = None) -> OccupancyMap:
    """The map of every pool; ``gpu_counts`` (node -> GPUs its labels count) adds the nodes whose
    GPUs publish nothing and says how many GPUs of a node are missing from the map."""
    nodes = []
    counts = dict(gpu_counts or {})
    for pool in pools:
        by_gpu: dict[str, list[PublishedDevice]] = defaultdict(list)
        for device in pool.devices:
            by_gpu[device.device.gpu_uuid].append(device)
        gpus = sorted((gpu_map(pool.node, ds, pool.counter_sets) for ds in by_gpu.values()), key=lambda g: g.index)
        missing = max(0, counts.pop(pool.node, len(gpus)) - len(gpus))
        nodes.append(NodeMap(pool.node, tuple(gpus), pool.complete, pool.generation, missing))
    nodes += [NodeMap(name, (), gpus_without_devices=count) for name, count in counts.items() if count]
    return OccupancyMap(tuple(sorted(nodes, key=lambda n: n.name)))


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def as_json(value: Any) -> Any:
    """Dataclasses of this map (and of totals) as plain JSON values, for ``-o json``: camelCase keys
    as in every Kubernetes object."""
    if isinstance(value, PublishedDevice):
        return {"name": value.name, "policy": value.device.policy, "kind": value.device.kind,
                "memory": value.device.memory, "state": value.state, "reasons": list(value.reasons),
                "holders": [as_json(h) for h in value.holders]}
    if is_dataclass(value) and not isinstance(value, type):
        result = {_camel(f.name): as_json(getattr(value, f.name)) for f in fields(value)}
        for extra in ("ref", "who"):
            if hasattr(type(value), extra):
                result[extra] = getattr(value, extra)
        return result
    if isinstance(value, Mapping):
        return {str(k): as_json(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [as_json(v) for v in value]
    return value
