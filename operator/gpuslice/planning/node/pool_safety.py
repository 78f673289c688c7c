"""Never remove or change a device a claim has allocated.

The scheduler recomputes counter use from the slices as they are now: drop an
allocated device, or change what it consumes, and the GPU memory it holds
looks free and gets handed out twice. So a plan that would do that is held
back for those devices: the published device stays exactly as it was, gains a
``NoSchedule`` taint ``gpuslice.dev/pending-change`` so nothing new lands on
it, and the change applies once the claim is gone. A GPU whose held devices
use another counter set than the new plan (a change of mode) gets none of the
new devices until then: counters of different sets cannot guard each other.

Devices no claim holds are not changed at once either. The scheduler may have
picked one already and write the claim a moment later (it reserves in memory and
records the allocation at PreBind), and a claim may be allocated between the
agent's read of the claims and its write. So a device the plan removes or
changes first *drains*: it is published tainted, as a held one, and only once it
has been so for a while (the caller says which devices have: ``drained``) and
the claims read again after that still show it free does the change apply.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

from gpuslice.dra.names import PENDING_TAINT_KEY
from gpuslice.dra.quantity import parse_quantity
from gpuslice.dra.wire import device_gpu
from gpuslice.jsontypes import Object
from gpuslice.planning.node.node_pool import NodePlan, PlannedSlice, layout
from gpuslice.planning.node.taints import with_status_taints, without_agent_taints

_QUANTITY_KEYS = {"value", "default", "min", "max", "step"}


def normalized(obj: Any, key: str = "") -> Any:
    """Content as the apiserver means it: quantities compared by value, taint times ignored."""
    if isinstance(obj, dict):
        return {k: normalized(v, k) for k, v in obj.items() if k != "timeAdded"}
    if isinstance(obj, list):
        return [normalized(v) for v in obj]
    if key in _QUANTITY_KEYS and isinstance(obj, str):
        try:
            return parse_quantity(obj)
        except ValueError:
            return obj
    if key in _QUANTITY_KEYS and isinstance(obj, int):
        return Fraction(obj)
    return obj


def _as_planned(device: Object) -> Object:
    """The device as planned: without the taints the agent adds (pending change, GPU statuses)."""
    return without_agent_taints(device)


def _with_pending(device: Object) -> Object:
    taints = [t for t in device.get("taints", []) if t.get("key") != PENDING_TAINT_KEY]
    # No empty value: the apiserver omits it, and the published device must read back equal.
    taints.append({"key": PENDING_TAINT_KEY, "effect": "NoSchedule"})
    return {**device, "taints": taints}


def _untainted(device: Object) -> Object:
    return {k: v for k, v in device.items() if k != "taints"}


def same_device(new: Object, old: Object) -> bool:
    """The same device for any claim that holds it: equal but for taints. A policy's taints
    may change on an allocated device at once; they change what may land on it (or, with
    NoExecute, who may stay), not what a claim holds."""
    return bool(normalized(_untainted(new)) == normalized(_untainted(old)))


def changing(plan: NodePlan, published: Iterable[Object], frozen: Set[str] = frozenset()) -> set[str]:
    """Published devices the plan would remove or alter (beyond taints): only these need
    the claims read, and only while some exist does the agent need to watch claims."""
    wanted = {d["name"]: d for d in plan.devices}
    found = set()
    for device in published:
        name = device["name"]
        if name in frozen:
            continue
        new = wanted.get(name)
        if new is None or not same_device(new, _as_planned(device)):
            found.add(name)
    return found


def with_statuses(slices: Iterable[PlannedSlice],
                  taints: Mapping[str, Sequence[Object]]) -> tuple[PlannedSlice, ...]:
    """``slices`` with each device carrying its GPU's status taints (and no stale ones)."""
    return tuple(replace(s, devices=tuple(with_status_taints(d, taints.get(device_gpu(d) or "", ()))
                                          for d in s.devices))
                 for s in slices)


# The signature of a device no counter set guards: the scheduler's capacity accounting does
# (a consumable-capacity device, ModeTraits.consumable), which no counter set can be mixed with.
_CAPACITY_GUARDED = frozenset({"capacity"})


def _signature(device: Object) -> frozenset[str]:
    """What guards the device's share of the GPU: its counter sets, or the scheduler's capacity
    accounting. Read from the device as published, whatever its mode."""
    sets = frozenset(str(c["counterSet"]) for c in device.get("consumesCounters") or [])
    return sets or _CAPACITY_GUARDED


@dataclass(frozen=True)
class SafePlan:
    slices: tuple[PlannedSlice, ...]
    held: tuple[str, ...]  # allocated devices kept as they were, change pending
    blocked_gpus: tuple[str, ...]  # GPUs (UUIDs) whose new layout waits for their claims
    draining: tuple[str, ...] = ()  # free devices kept, tainted, until they have drained


def make_safe(
    plan: NodePlan, published: Iterable[Object], counter_sets: Iterable[Mapping[str, Any]], allocated: Set[str],
    drained: Set[str] | None = None, frozen: Set[str] = frozenset(),
) -> SafePlan:
    """``plan``, except that allocated devices stay as published and free ones drain first
    (see module doc). ``drained=None`` means every free device may change at once.

    ``frozen`` devices stay exactly as published, untainted: their policy's current spec is not
    one to act on (it does not parse, or the controller has not found it valid), and bad input
    never changes what was already published.
    """
    live = {d["name"]: d for d in published}
    live_sets = {str(c["name"]): dict(c) for c in counter_sets}
    wanted = {d["name"]: d for d in plan.devices if d["name"] not in frozen}
    held: dict[str, Object] = {name: _as_planned(live[name]) for name in sorted(frozen & set(live))}
    draining: list[str] = []
    for name in sorted(set(live) - frozen):
        old = _as_planned(live[name])
        new = wanted.get(name)
        if new is not None and same_device(new, old):
            continue
        if name in allocated:
            held[name] = _with_pending(old)
        elif drained is not None and name not in drained:
            held[name] = _with_pending(old)
            draining.append(name)

    held_by_gpu: dict[str | None, set[frozenset[str]]] = {}
    for device in held.values():
        held_by_gpu.setdefault(device_gpu(device), set()).add(_signature(device))
    blocked = set()
    for gpu, signatures in held_by_gpu.items():
        new_signatures = {_signature(d) for d in wanted.values() if device_gpu(d) == gpu and d["name"] not in held}
        combined = signatures | new_signatures
        # Mixing is safe only under one counter set; a capacity-guarded device is never mixed.
        if gpu is None or (new_signatures and (len(combined) > 1 or _CAPACITY_GUARDED in combined)):
            blocked.add(gpu)

    devices = [d for name, d in wanted.items() if name not in held and device_gpu(d) not in blocked]
    devices += held.values()
    needed_sets = {str(c["counterSet"]) for d in devices for c in d.get("consumesCounters") or []}
    sets = {str(c["name"]): c for c in plan.counter_sets}
    for name in needed_sets - set(sets):
        if name in live_sets:
            sets[name] = live_sets[name]
    final_sets = [c for name, c in sets.items() if name in needed_sets]
    blocked_gpus = tuple(sorted(g for g in blocked if g is not None))
    allocated_held = tuple(sorted(set(held) - set(draining) - frozen))
    return SafePlan(layout(final_sets, devices), allocated_held, blocked_gpus, tuple(draining))
