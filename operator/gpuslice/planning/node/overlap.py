"""The line behind the scheduler at prepare: no device goes to two claims, and no GPU gives more than it has.

The scheduler allocates a device to one claim, keeps partitions within their GPU's counters and
consumable capacity within the device's. It can still be wrong on a node: allocations it wrote
from stale state (kubernetes/kubernetes#136269), pods force-deleted while the kubelet still holds
their claims' devices, a claim's status forged by whoever may write it. NVIDIA's kubelet plugin
refuses to prepare a device that a prepared claim already holds (``validateNoOverlappingPreparedDevices``,
``cmd/gpu-kubelet-plugin/device_state.go``); this does the same, and also re-counts what the
scheduler counted: the counters of every partition prepared on a GPU, and the consumed capacity
of every share of a shared device. Admin access takes nothing, on either side, as in DRA.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from gpuslice.dra.quantity import format_bytes, parse_quantity
from gpuslice.planning.devices import CounterSet, Device


@dataclass(frozen=True)
class Holding:
    """A device a claim holds on this node: prepared (or being prepared), or asked for."""

    claim: str  # namespace/name, for the message
    uid: str
    device: str
    consumed: int | None = None  # bytes of a shared device's capacity; None: the whole device
    admin: bool = False


def overlaps(wanted: Sequence[Holding], held: Iterable[Holding], devices: Mapping[str, Device],
             counter_sets: Iterable[CounterSet]) -> list[str]:
    """Why ``wanted`` (one claim's devices) cannot be prepared beside ``held`` (every other claim's
    prepared devices on this node); empty when it can. ``devices`` and ``counter_sets`` are what the
    node's pool publishes; a held device no longer published is judged by its name alone."""
    uids = {w.uid for w in wanted}
    taken = [h for h in held if not h.admin and h.uid not in uids]
    asked = [w for w in wanted if not w.admin]
    problems = []
    for want in asked:
        device = devices.get(want.device)
        others = [h for h in taken if h.device == want.device]
        if device is not None and device.traits.consumable:
            total = sum(_share(h, device) for h in others) + _share(want, device)
            if total > device.memory:
                problems.append(
                    f"device {want.device} has {format_bytes(device.memory)} and its shares would take"
                    f" {format_bytes(total)}: {_owners(others)} already hold"
                    f" {format_bytes(total - _share(want, device))}")
        elif others:
            problems.append(f"device {want.device} is already prepared for {_owners(others)}")
    problems += _over_counters([*taken, *asked], devices, counter_sets, {w.device for w in asked})
    return problems


def _share(holding: Holding, device: Device) -> int:
    return device.memory if holding.consumed is None else holding.consumed


def _owners(holdings: Sequence[Holding]) -> str:
    return ", ".join(sorted({f"claim {h.claim} (uid {h.uid})" for h in holdings}))


def _over_counters(holdings: Sequence[Holding], devices: Mapping[str, Device], counter_sets: Iterable[CounterSet],
                   asked: set[str]) -> list[str]:
    """Counters of a set that the holdings together take beyond what it has, where one of ``asked``
    draws on that set (the overlap of partitions: a whole GPU and a slice of it, two MIG
    placements on the same memory slices)."""
    capacity = {s.name: {k: parse_quantity(v) for k, v in s.counters} for s in counter_sets}
    used: dict[str, dict[str, Fraction]] = {}
    by_set: dict[str, set[str]] = {}
    for holding in holdings:
        device = devices.get(holding.device)
        if device is None or device.counter_set is None or device.counter_set not in capacity:
            continue
        by_set.setdefault(device.counter_set, set()).add(holding.device)
        for counter, value in device.counters:
            taken = used.setdefault(device.counter_set, {})
            taken[counter] = taken.get(counter, Fraction(0)) + parse_quantity(value)
    problems = []
    for name, taken in sorted(used.items()):
        if not by_set[name] & asked:
            continue
        over = sorted(c for c, v in taken.items() if v > capacity[name].get(c, Fraction(0)))
        if over:
            problems.append(f"the devices prepared on counter set {name} ({', '.join(sorted(by_set[name]))}) would"
                            f" take more than it has of {', '.join(over)}")
    return problems
