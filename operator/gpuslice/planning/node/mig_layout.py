"""Static MIG layouts on the node: which GPUs must match which layout, what it takes to get there,
and the devices of the instances that exist meanwhile (pure).

A static layout's devices are published only once the GPU has exactly those instances:
until then the GPU publishes the devices of the instances it really has. Getting
there is a list of steps (MIG mode on, the unwanted instances destroyed, the wanted
ones created, large ones first so that placements stay as planned), which the node
agent's MIG manager carries out and ``gpuslice plan --from`` shows in advance.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.inventory.gpus import Gpu
from gpuslice.planning.devices import Device
from gpuslice.planning.modes.mig import mig_device

Instance = tuple[str, int]  # (profile, start memory slice): what a published MIG device names


@dataclass(frozen=True)
class LayoutTarget:
    """A GPU that a static layout policy owns, and the instances that layout places on it."""

    gpu_uuid: str
    policy: str
    instances: tuple[Instance, ...]


@dataclass(frozen=True)
class Step:
    action: Literal["enable-mig", "destroy", "create"]
    profile: str = ""
    start: int = 0

    def describe(self) -> str:
        if self.action == "enable-mig":
            return "enable MIG mode"
        return f"{self.action} {self.profile} at memory slice {self.start}"


def layout_targets(devices: Iterable[Device], policies: Iterable[GpuSlicePolicy]) -> dict[str, LayoutTarget]:
    """The GPUs whose planned devices come from a static ``mig.layout``, by UUID."""
    # slicing.mig is set in mig mode only (the schema's rule).
    static = {p.name for p in policies if p.spec.slicing.mig is not None and p.spec.slicing.mig.layout}
    found: dict[str, list[Device]] = {}
    for device in devices:
        if device.traits.instances and device.policy in static and device.profile and device.placement:
            found.setdefault(device.gpu_uuid, []).append(device)
    return {uuid: LayoutTarget(uuid, found_devices[0].policy, tuple(sorted(
        (d.profile or "", d.placement[0]) for d in found_devices if d.placement is not None)))
        for uuid, found_devices in found.items()}


def steps(mig_enabled: bool, existing: Iterable[Instance], wanted: Iterable[Instance],
          sizes: Mapping[str, int]) -> list[Step]:
    """From the instances that exist to the wanted ones: MIG mode first, then every unwanted instance
    destroyed (so its memory slices are free), then the wanted ones created, largest first."""
    have, want = set(existing), set(wanted)
    result = [] if mig_enabled else [Step("enable-mig")]
    result += [Step("destroy", p, s) for p, s in sorted(have - want)]
    result += [Step("create", p, s) for p, s in sorted(want - have, key=lambda i: (-sizes.get(i[0], 0), i[1], i[0]))]
    return result


def inverse(done: Sequence[Step]) -> list[Step]:
    """The steps that undo ``done`` (for a rollback), in reverse order. MIG mode stays on."""
    back = {"create": "destroy", "destroy": "create"}
    return [Step(back[s.action], s.profile, s.start) for s in reversed(done)  # type: ignore[arg-type]
            if s.action in back]


def devices_of(gpu: Gpu, policy: GpuSlicePolicy, instances: Iterable[Instance]) -> list[Device]:
    """The devices that stand for the instances a GPU has (ones of profiles it does not know are left
    out: they are not gpuslice's to offer)."""
    found = []
    for name, start in sorted(instances):
        profile = gpu.mig_profile(name)
        if profile is not None and start in profile.starts:
            found.append(mig_device(gpu, policy, profile, start))
    return found
