"""Known GPU models, with the figures that slicing decisions depend on.

The fake backend pretends to be these GPUs, and the controller uses the same
figures to judge a policy against the nodes it selects. Memory is the nominal
size (80Gi for an H100 80GB), which is what the fake backend reports; a real
GPU reports its usable memory through NVML, slightly less.
"""

from __future__ import annotations

from dataclasses import dataclass

GI = 1024**3


MEMORY_SLICES = 8  # every MIG-capable GPU here has 8 memory slices (and 7 compute slices)


@dataclass(frozen=True)
class MigProfile:
    """One MIG GPU-instance profile, e.g. ``1g.10gb``; ``max_count`` fit on one GPU at once.

    ``starts`` are the memory-slice indexes where an instance may be placed and ``size`` how
    many memory slices it covers (NVML's placement table); ``media`` marks the ``+me``
    profiles, which take the GPU's one set of media engines.
    """

    name: str
    memory: int
    max_count: int
    size: int = 1
    starts: tuple[int, ...] = ()
    media: bool = False

    @property
    def compute_slices(self) -> int:
        return int(self.name.split("g.", 1)[0])

    def placements(self) -> tuple[tuple[int, int], ...]:
        """(start, size) of every placement, in NVML's order."""
        return tuple((start, self.size) for start in self.starts)


@dataclass(frozen=True)
class GpuModel:
    key: str  # short name used on the command line and in node labels
    product_name: str  # as NVML reports it
    memory: int
    architecture: str
    compute_capability: str
    mig_profiles: tuple[MigProfile, ...] = ()

    @property
    def mig_capable(self) -> bool:
        return bool(self.mig_profiles)

    def mig_profile(self, name: str) -> MigProfile | None:
        return next((p for p in self.mig_profiles if p.name == name), None)


def _mig(unit: int, double: int, big: int, full: int) -> tuple[MigProfile, ...]:
    """The seven-slice MIG family of A100/H100/H200 by their memory figures in GB, with
    NVML's placement table (start memory slice, size in memory slices)."""
    return (
        MigProfile(f"1g.{unit}gb", unit * GI, 7, 1, (0, 1, 2, 3, 4, 5, 6)),
        MigProfile(f"1g.{unit}gb+me", unit * GI, 1, 1, (0, 1, 2, 3, 4, 5, 6), media=True),
        MigProfile(f"1g.{double}gb", double * GI, 4, 2, (0, 2, 4, 6)),
        MigProfile(f"2g.{double}gb", double * GI, 3, 2, (0, 2, 4)),
        MigProfile(f"3g.{big}gb", big * GI, 2, 4, (0, 4)),
        MigProfile(f"4g.{big}gb", big * GI, 1, 4, (0,)),
        MigProfile(f"7g.{full}gb", full * GI, 1, 8, (0,)),
    )


MODELS: dict[str, GpuModel] = {
    model.key: model
    for model in (
        GpuModel("h100-80gb", "NVIDIA H100 80GB HBM3", 80 * GI, "Hopper", "9.0", _mig(10, 20, 40, 80)),
        GpuModel("h200-141gb", "NVIDIA H200", 141 * GI, "Hopper", "9.0", _mig(18, 35, 71, 141)),
        GpuModel("a100-40gb", "NVIDIA A100-SXM4-40GB", 40 * GI, "Ampere", "8.0", _mig(5, 10, 20, 40)),
        GpuModel("a100-80gb", "NVIDIA A100-SXM4-80GB", 80 * GI, "Ampere", "8.0", _mig(10, 20, 40, 80)),
        GpuModel("l4", "NVIDIA L4", 24 * GI, "Ada Lovelace", "8.9"),
        GpuModel("l40s", "NVIDIA L40S", 48 * GI, "Ada Lovelace", "8.9"),
    )
}
