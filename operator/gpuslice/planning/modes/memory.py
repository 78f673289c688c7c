"""``memory`` mode: fixed slices of ``sliceSize`` that draw on the GPU's counter set (KEP-4815).

Several memory-mode policies may slice one GPU at different sizes: each slice
consumes its memory (and a proportional share of compute) from the GPU's one
counter set, so whatever the scheduler combines stays within the GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.dra.names import device_class_name
from gpuslice.dra.quantity import format_bytes
from gpuslice.inventory.gpus import Gpu
from gpuslice.planning.devices import CounterSet, Device, Mode, device_name, gpu_ref, gpu_tag
from gpuslice.planning.grants import Grant, common_environment, prefixed
from gpuslice.planning.kinds import FULL, SLICE, DeviceKind, selector
from gpuslice.planning.mode_traits import FULL_SLICE_SIZE, MEMORY, ModeTraits
from gpuslice.planning.room import FREE, C, Room, by_state
from gpuslice.planning.selection import MAX_SLICES_PER_GPU, Problem, Selection

COMPUTE_UNITS = 1000  # a GPU's compute, in thousandths, shared in proportion to memory
MI = 1024**2


def _counters(gpu: Gpu, memory: int) -> tuple[tuple[str, str], ...]:
    return (("compute", str(COMPUTE_UNITS * memory // gpu.memory)), ("memory", format_bytes(memory)))


@dataclass(frozen=True)
class MemoryMode:
    traits: ModeTraits = MEMORY
    exclusive: bool = False

    @property
    def name(self) -> Mode:
        return self.traits.name

    def devices(self, gpu: Gpu, policies: Sequence[GpuSlicePolicy], notes: list[str]) -> list[Device]:
        found = []
        counter_set = gpu_tag(gpu.uuid)
        for policy in sorted(policies, key=lambda p: p.spec.slicing.slice_bytes):
            slicing = policy.spec.slicing
            size = slicing.slice_bytes
            if size > gpu.memory:
                notes.append(f"{policy.name}: sliceSize {slicing.slice_size} is larger than GPU {gpu.index}"
                             f" ({format_bytes(gpu.memory)})")
                continue
            if gpu.memory // size > MAX_SLICES_PER_GPU:
                notes.append(f"{policy.name}: sliceSize {slicing.slice_size} makes more than"
                             f" {MAX_SLICES_PER_GPU} slices of GPU {gpu.index}")
                continue
            tag = format_bytes(size).lower()
            common = {"policy": policy.name, "mode": self.name, "counter_set": counter_set, **gpu_ref(gpu)}
            found += [Device(name=device_name(gpu, policy.name, f"{tag}-{k}"), kind="slice", memory=size,
                             slice_size=slicing.slice_size, counters=_counters(gpu, size), **common)
                      for k in range(gpu.memory // size)]
            if slicing.allow_full_gpu:
                found.append(Device(name=device_name(gpu, policy.name, "full"), kind="full", memory=gpu.memory,
                                    counters=_counters(gpu, gpu.memory), **common))
        return found

    def kinds(self, policy: GpuSlicePolicy, selection: Selection) -> list[DeviceKind]:
        name, slicing = policy.name, policy.spec.slicing
        assert slicing.slice_size is not None
        found = [DeviceKind(SLICE, device_class_name(name), slicing.slice_bytes,
                            selector(name, mode=self.name, sliceSize=slicing.slice_size), "")]
        if slicing.allow_full_gpu:
            largest = max((g.memory for g in selection.gpus if g.memory is not None), default=0)
            smallest = min((g.memory for g in selection.gpus if g.memory is not None), default=0)
            found.append(DeviceKind(FULL, f"{FULL}.{device_class_name(name)}", largest,
                                    selector(name, mode=self.name, sliceSize=FULL_SLICE_SIZE), f"-{FULL}", smallest))
        return found

    def counter_set(self, gpu: Gpu) -> CounterSet | None:
        return CounterSet(gpu_tag(gpu.uuid), _counters(gpu, gpu.memory))

    def fit_problems(self, policy: GpuSlicePolicy, selection: Selection) -> list[Problem]:
        return slice_fit_problems(policy, selection, max_slices=MAX_SLICES_PER_GPU)

    def room(self, kind: str, candidates: Sequence[C], on_gpu: Sequence[C], free_memory: int,
             request: int | None) -> Room[C]:
        if kind == FULL:  # a whole GPU: nothing else on it may be held
            return by_state([] if any(d.allocated for d in on_gpu) else candidates)
        idle = [d for d in candidates if not d.allocated]
        count = free_memory // idle[0].device.memory if idle else 0  # slices the counter set has room for
        ok = [d for d in idle if d.state == FREE][:count]
        return Room(ok, [d for d in idle if d.state != FREE][:max(0, count - len(ok))])

    def example(self, gpu: Gpu) -> dict[str, Any] | None:
        return {"mode": self.name, "sliceSize": "4Gi", "allowFullGpu": True}

    def environment(self, grant: Grant) -> dict[str, str]:
        return prefixed({**common_environment(grant), "SLICE_SIZE": grant.device.slice_size or "full"})


def slice_fit_problems(policy: GpuSlicePolicy, selection: Selection, max_slices: int | None) -> list[Problem]:
    """sliceSize against every selected GPU: it must fit the smallest, and (memory mode) not cut
    the largest into more than ``max_slices``."""
    slicing = policy.spec.slicing
    sized = [(g, g.memory) for g in selection.sized if g.memory is not None]
    if not sized:
        return []
    smallest, smallest_memory = min(sized, key=lambda s: (s[1], s[0].node))
    largest, largest_memory = max(sized, key=lambda s: (s[1], s[0].node))
    if slicing.slice_bytes > smallest_memory:
        return [Problem(
            "SliceLargerThanGpu",
            f"slicing.sliceSize {slicing.slice_size} is larger than {smallest.product_name} on {smallest.node}"
            f" ({format_bytes(smallest_memory)}), which the policy selects; choose a sliceSize of at most"
            f" {format_bytes(smallest_memory)}, or leave such GPUs out with spec.gpuSelector"
            f" (e.g. minMemory: {slicing.slice_size}).",
        )]
    if max_slices is not None and largest_memory // slicing.slice_bytes > max_slices:
        least = -(-largest_memory // max_slices)
        least = -(-least // MI) * MI
        return [Problem(
            "TooManySlices",
            f"slicing.sliceSize {slicing.slice_size} cuts {largest.product_name} ({format_bytes(largest_memory)}"
            f" on {largest.node}) into {largest_memory // slicing.slice_bytes} slices; at most"
            f" {max_slices} per GPU are published; choose a sliceSize of at least {format_bytes(least)}.",
        )]
    return []


MODE = MemoryMode()
