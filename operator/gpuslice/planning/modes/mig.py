"""``mig`` mode: hardware MIG partitions, guarded by one counter per memory slice.

Dynamic MIG (``profiles``) offers every placement of each profile as a device;
the instance is created when a claim is prepared. Overlapping placements
consume the same ``memory-slice-<i>`` counters, so the scheduler never
allocates two that overlap. Static MIG (``layout``) publishes the instances
of a layout placed by backtracking over NVML's placement table.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.dra.names import device_class_name
from gpuslice.inventory.catalog import GI, MEMORY_SLICES, MigProfile
from gpuslice.inventory.gpus import Gpu
from gpuslice.planning.devices import CounterSet, Device, Mode, gpu_ref, gpu_tag
from gpuslice.planning.grants import Grant, common_environment, prefixed
from gpuslice.planning.kinds import DeviceKind, profile_tag, selector
from gpuslice.planning.mig_placement import mig_device_name, static_layout
from gpuslice.planning.mode_traits import MIG, ModeTraits
from gpuslice.planning.room import C, Candidate, Room, by_state
from gpuslice.planning.selection import Problem, Selection

MEDIA = "media-engines"


def _slices(device: Candidate) -> set[int]:
    """The memory slices a placement takes."""
    start, size = device.device.placement or (0, 0)
    return set(range(start, start + size))


def _media(device: Candidate) -> bool:
    """The placement takes the GPU's media engines (a ``+me`` profile)."""
    return any(name == MEDIA for name, _ in device.device.counters)


def profile_memory(profile: str, selection: Selection, pick: Callable[[list[int]], int] = max) -> int:
    """What one instance of ``profile`` has on the GPUs selected (the largest figure, or what
    ``pick`` takes); for GPUs the catalog does not know, the GB figure in its name read as GiB
    (above what NVML reports)."""
    known = [p.memory for g in selection.gpus if g.model for p in g.model.mig_profiles if p.name == profile]
    if known:
        return pick(known)
    nominal = profile.split(".", 1)[1].removesuffix("+me").removesuffix("gb")
    return int(nominal) * GI if nominal.isdigit() else 0


def counter_set_name(gpu: Gpu) -> str:
    return f"{gpu_tag(gpu.uuid)}-mig"


def mig_device(gpu: Gpu, policy: GpuSlicePolicy, profile: MigProfile, start: int) -> Device:
    counters = [(f"memory-slice-{i}", "1") for i in range(start, start + profile.size)]
    if profile.media:
        counters.append((MEDIA, "1"))
    return Device(
        name=mig_device_name(gpu_tag(gpu.uuid), profile.name, start), policy=policy.name, mode=MIG.name,
        kind=profile.name, memory=profile.memory, profile=profile.name, placement=(start, profile.size),
        counter_set=counter_set_name(gpu), counters=tuple(sorted(counters)), engines=profile.engines, **gpu_ref(gpu),
    )


@dataclass(frozen=True)
class MigMode:
    traits: ModeTraits = MIG
    exclusive: bool = True

    @property
    def name(self) -> Mode:
        return self.traits.name

    def devices(self, gpu: Gpu, policies: Sequence[GpuSlicePolicy], notes: list[str]) -> list[Device]:
        policy = policies[0]
        mig = policy.spec.slicing.mig
        assert mig is not None
        if not gpu.mig_capable:
            notes.append(f"{policy.name}: GPU {gpu.index} ({gpu.product_name}) has no MIG")
            return []
        if mig.layout:
            placed = static_layout(gpu, mig.layout)
            if placed is None:
                notes.append(f"{policy.name}: MIG layout does not fit GPU {gpu.index} ({gpu.product_name})")
                return []
            return [mig_device(gpu, policy, profile, start) for profile, start in placed]
        found: list[Device] = []
        for name in mig.profiles or []:
            profile = gpu.mig_profile(name)
            if profile is None:
                notes.append(f"{policy.name}: GPU {gpu.index} ({gpu.product_name}) has no MIG profile {name}")
                continue
            found.extend(mig_device(gpu, policy, profile, start) for start in profile.starts)
        return found

    def kinds(self, policy: GpuSlicePolicy, selection: Selection) -> list[DeviceKind]:
        name, mig = policy.name, policy.spec.slicing.mig
        assert mig is not None
        profiles = list(dict.fromkeys([*(mig.profiles or []), *(mig.layout or {})]))
        kinds = [DeviceKind(p, f"{profile_tag(p)}.{device_class_name(name)}", profile_memory(p, selection),
                            selector(name, mode=self.name, profile=p), f"-{profile_tag(p)}",
                            profile_memory(p, selection, min))
                 for p in profiles]
        return sorted(kinds, key=lambda k: (k.memory, k.kind))

    def counter_set(self, gpu: Gpu) -> CounterSet | None:
        counters = [(f"memory-slice-{i}", "1") for i in range(MEMORY_SLICES)] + [(MEDIA, "1")]
        return CounterSet(counter_set_name(gpu), tuple(sorted(counters)))

    def fit_problems(self, policy: GpuSlicePolicy, selection: Selection) -> list[Problem]:
        slicing = policy.spec.slicing
        assert slicing.mig is not None
        problems = []
        wanted = list(slicing.mig.profiles or []) + list(slicing.mig.layout or {})
        for gpus in selection.gpus:
            if gpus.model is None:
                continue  # a product the catalog does not know: the node agent will judge it
            if not gpus.model.mig_capable:
                problems.append(Problem(
                    "GpuNotMigCapable",
                    f"mode mig selects {gpus.product_name} on {gpus.node}, which has no MIG; narrow"
                    " spec.gpuSelector.products or spec.nodeSelector to MIG-capable GPUs.",
                ))
                continue
            for profile in wanted:
                if gpus.model.mig_profile(profile) is None:
                    offered = ", ".join(dict.fromkeys(p.name for p in gpus.model.mig_profiles))
                    problems.append(Problem(
                        "UnknownMigProfile",
                        f"MIG profile {profile} does not exist on {gpus.product_name} ({gpus.node});"
                        f" it offers {offered}.",
                    ))
            layout = slicing.mig.layout
            if layout and all(gpus.model.mig_profile(p) for p in layout) and static_layout(gpus.model, layout) is None:
                problems.append(Problem(
                    "MigLayoutDoesNotFit",
                    f"slicing.mig.layout {dict(layout)} does not fit {gpus.product_name} ({gpus.node}): its"
                    f" instances need more memory slices than the GPU's {MEMORY_SLICES}, or overlap in every"
                    " placement; use fewer or smaller instances.",
                ))
        # One problem per reason and profile is enough to act on; keep the first of each.
        unique: dict[tuple[str, str], Problem] = {}
        for problem in problems:
            unique.setdefault((problem.reason, problem.message.split(" (")[0]), problem)
        return list(unique.values())

    def room(self, kind: str, candidates: Sequence[C], on_gpu: Sequence[C], free_memory: int,
             request: int | None) -> Room[C]:
        taken = {i for d in on_gpu if d.allocated for i in _slices(d)}
        media_taken = any(d.allocated and _media(d) for d in on_gpu)
        fits = [d for d in candidates
                if not d.allocated and not taken & _slices(d) and not (media_taken and _media(d))]
        room = by_state(fits)  # a profile's placements never overlap (NVML's placement tables)
        if not any(_media(d) for d in fits):
            return room
        # The GPU's one media-engines counter: a single ``+me`` instance at a time, free or kept off.
        return Room(room.ok[:1], [] if room.ok else room.off[:1])

    def example(self, gpu: Gpu) -> dict[str, Any] | None:
        if not gpu.mig_profiles:
            return None
        return {"mode": self.name, "mig": {"profiles": [p.name for p in gpu.mig_profiles]}}

    def environment(self, grant: Grant) -> dict[str, str]:
        device = grant.device
        env = {**common_environment(grant), "MIG_PROFILE": device.profile or device.kind}
        if device.placement is not None:
            env["MIG_PLACEMENT"] = f"{device.placement[0]}+{device.placement[1]}"  # first memory slice + slices
        if grant.mig_uuid:
            env["MIG_UUID"] = grant.mig_uuid
        return prefixed(env)


MODE = MigMode()
