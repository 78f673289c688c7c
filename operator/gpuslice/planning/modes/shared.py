"""``shared`` mode: one device per GPU that many claims share (KEP-5075 consumable capacity).

The device has ``allowMultipleAllocations`` and a ``memory`` capacity whose
request policy takes steps of ``sliceSize``; the scheduler's capacity
accounting keeps the sum of requests within the GPU. The GPU belongs to the
one policy: capacity accounting and counter sets cannot guard each other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.dra.names import device_class_name
from gpuslice.dra.quantity import format_bytes
from gpuslice.inventory.gpus import Gpu
from gpuslice.planning.devices import CounterSet, Device, Mode, device_name, gpu_ref
from gpuslice.planning.grants import Grant, common_environment, prefixed
from gpuslice.planning.kinds import SHARED as SHARED_KIND
from gpuslice.planning.kinds import DeviceKind, selector
from gpuslice.planning.mode_traits import SHARED, ModeTraits
from gpuslice.planning.modes.memory import slice_fit_problems
from gpuslice.planning.room import ALLOCATED, FREE, C, Room, by_state
from gpuslice.planning.selection import Problem, Selection


@dataclass(frozen=True)
class SharedMode:
    traits: ModeTraits = SHARED
    exclusive: bool = True

    @property
    def name(self) -> Mode:
        return self.traits.name

    def devices(self, gpu: Gpu, policies: Sequence[GpuSlicePolicy], notes: list[str]) -> list[Device]:
        policy = policies[0]
        slicing = policy.spec.slicing
        # The apiserver would reject the whole slice: the request policy's min and min + step
        # (one and two slices) must fit the capacity.
        if slicing.slice_bytes > gpu.memory:
            notes.append(f"{policy.name}: sliceSize {slicing.slice_size} is larger than GPU {gpu.index}"
                         f" ({format_bytes(gpu.memory)})")
            return []
        if 2 * slicing.slice_bytes > gpu.memory:
            notes.append(f"{policy.name}: sliceSize {slicing.slice_size} is more than half of GPU {gpu.index}"
                         f" ({format_bytes(gpu.memory)}); a shared device needs room for two")
            return []
        return [Device(name=device_name(gpu, policy.name, "shared"), policy=policy.name, mode=self.name,
                       kind="shared", memory=gpu.memory, slice_size=slicing.slice_size, **gpu_ref(gpu))]

    def kinds(self, policy: GpuSlicePolicy, selection: Selection) -> list[DeviceKind]:
        return [DeviceKind(SHARED_KIND, device_class_name(policy.name), policy.spec.slicing.slice_bytes,
                           selector(policy.name, mode=self.name), "")]

    def counter_set(self, gpu: Gpu) -> CounterSet | None:
        return None

    def fit_problems(self, policy: GpuSlicePolicy, selection: Selection) -> list[Problem]:
        problems = slice_fit_problems(policy, selection, max_slices=None)
        sized = [(g, g.memory) for g in selection.sized if g.memory is not None]
        if problems or not sized:
            return problems
        smallest, smallest_memory = min(sized, key=lambda s: (s[1], s[0].node))
        if 2 * policy.spec.slicing.slice_bytes > smallest_memory:
            half = format_bytes(smallest_memory // 2 // 1024**2 * 1024**2)
            return [Problem(
                "SliceTooLargeToShare",
                f"slicing.sliceSize {policy.spec.slicing.slice_size} is more than half of {smallest.product_name} on"
                f" {smallest.node} ({format_bytes(smallest_memory)}): a shared device's capacity must hold at least"
                f" two sliceSize steps (the apiserver refuses it otherwise); choose a sliceSize of at most {half},"
                " or use mode memory for whole GPUs.",
            )]
        return []

    def room(self, kind: str, candidates: Sequence[C], on_gpu: Sequence[C], free_memory: int,
             request: int | None) -> Room[C]:
        # Many claims share the device: an allocated one takes more while the capacity lasts.
        return by_state((d for d in candidates if free_memory >= (request or d.step)), usable=(FREE, ALLOCATED))

    def example(self, gpu: Gpu) -> dict[str, Any] | None:
        return {"mode": self.name, "sliceSize": "4Gi"}

    def environment(self, grant: Grant) -> dict[str, str]:
        env = {**common_environment(grant), "SLICE_SIZE": grant.device.slice_size or ""}
        if grant.share_id:
            env["SHARE_ID"] = grant.share_id
        return prefixed(env)


MODE = SharedMode()
