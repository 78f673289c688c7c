"""How many devices of one kind a claim could get right now, GPU by GPU (pure).

The scheduler's arithmetic, read from the occupancy map; each mode does its own
(``SlicingMode.room``, over ``planning.room``'s view of a published device). A device
that would do but is tainted, draining or held is counted apart, so ``why`` can say
that the GPU is there but kept off."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpuslice.planning.modes import MODES
from gpuslice.planning.reads.occupancy import GpuMap
from gpuslice.planning.reads.published import PublishedDevice


@dataclass(frozen=True)
class Availability:
    """Devices of one kind on one GPU: those a claim could get, and those kept off."""

    gpu: GpuMap
    free: int
    kept_off: int  # would do, but tainted, draining or held
    reasons: tuple[str, ...] = ()  # why kept off


def _free_memory(gpu: GpuMap) -> int:
    used = 0
    for device in gpu.devices:
        if device.device.traits.consumable:
            used += sum(h.memory if h.memory is not None else 0 for h in device.users)
        elif device.allocated:
            used += device.device.memory
    return max(0, gpu.memory - used)


def _why(device: PublishedDevice) -> tuple[str, ...]:
    return device.reasons or ((device.state,) if device.state in ("draining", "held") else ())


def on_gpu(gpu: GpuMap, policy: str, kind: str, request: int | None = None) -> Availability:
    """``request``: the memory a shared-capacity request takes (rounded to the step). The room is
    the arithmetic of the devices' mode (``SlicingMode.room``)."""
    candidates = [d for d in gpu.devices if d.device.policy == policy and d.device.kind == kind]
    if not candidates:
        return Availability(gpu, 0, 0)
    room = MODES[candidates[0].device.mode].room(kind, candidates, gpu.devices, _free_memory(gpu), request)
    return Availability(gpu, len(room.ok), len(room.off), tuple(sorted({r for d in room.off for r in _why(d)})))


def across(gpus: Iterable[GpuMap], policy: str, kind: str, request: int | None = None) -> list[Availability]:
    return [on_gpu(g, policy, kind, request) for g in gpus if policy in g.policies]


def room_for(gpus: Sequence[GpuMap], policy: str, kind: str,
             memory: int | None) -> tuple[list[Availability], int | None]:
    """Where a request fits now, and the memory it takes: ``memory`` (its ``capacity.requests``)
    rounded up to the policy's step, as the scheduler rounds a shared device's request."""
    step = next((d.step for g in gpus for d in g.devices if d.device.policy == policy and d.step), 0)
    rounded = -(-memory // step) * step if memory and step else None
    return across(gpus, policy, kind, rounded), rounded


def largest_free(gpus: Iterable[GpuMap], policy: str) -> tuple[GpuMap, str, int] | None:
    """The largest device of ``policy`` a claim could get now: (GPU, kind, memory)."""
    best: tuple[GpuMap, str, int] | None = None
    for gpu in gpus:
        if policy not in gpu.policies:
            continue
        for kind in sorted({d.device.kind for d in gpu.devices if d.device.policy == policy}):
            found = on_gpu(gpu, policy, kind)
            if not found.free:
                continue
            sample = next(d for d in gpu.devices if d.device.policy == policy and d.device.kind == kind)
            memory = _free_memory(gpu) if sample.device.traits.consumable else sample.device.memory
            if best is None or memory > best[2]:
                best = (gpu, kind, memory)
    return best
