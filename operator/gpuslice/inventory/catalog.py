"""Known GPU models, with the figures that slicing decisions depend on.

The fake backend pretends to be these GPUs, and the controller uses the same
figures to judge a policy against the nodes it selects. Memory is the nominal
size (80Gi for an H100 80GB), which is what the fake backend reports; a real
GPU reports its usable memory through NVML, slightly less.
"""

from __future__ import annotations

from dataclasses import dataclass

GI = 1024**3


@dataclass(frozen=True)
class MigProfile:
    """One MIG GPU-instance profile, e.g. ``1g.10gb``; ``max_count`` fit on one GPU at once."""

    name: str
    memory: int
    max_count: int


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


def _mig(unit: int, big: int, full: int, small_me: str) -> tuple[MigProfile, ...]:
    """The seven-slice MIG family of A100/H100/H200, by their memory figures in GB."""
    return (
        MigProfile(f"1g.{unit}gb", unit * GI, 7),
        MigProfile(f"1g.{unit}gb+me", unit * GI, 1),
        MigProfile(f"1g.{small_me}gb", int(small_me) * GI, 4),
        MigProfile(f"2g.{small_me}gb", int(small_me) * GI, 3),
        MigProfile(f"3g.{big}gb", big * GI, 2),
        MigProfile(f"4g.{big}gb", big * GI, 1),
        MigProfile(f"7g.{full}gb", full * GI, 1),
    )


MODELS: dict[str, GpuModel] = {
    model.key: model
    for model in (
        GpuModel("h100-80gb", "NVIDIA H100 80GB HBM3", 80 * GI, "Hopper", "9.0", _mig(10, 40, 80, "20")),
        GpuModel("h200-141gb", "NVIDIA H200", 141 * GI, "Hopper", "9.0", _mig(18, 71, 141, "35")),
        GpuModel(
            "a100-40gb", "NVIDIA A100-SXM4-40GB", 40 * GI, "Ampere", "8.0",
            (
                MigProfile("1g.5gb", 5 * GI, 7),
                MigProfile("1g.5gb+me", 5 * GI, 1),
                MigProfile("1g.10gb", 10 * GI, 4),
                MigProfile("2g.10gb", 10 * GI, 3),
                MigProfile("3g.20gb", 20 * GI, 2),
                MigProfile("4g.20gb", 20 * GI, 1),
                MigProfile("7g.40gb", 40 * GI, 1),
            ),
        ),
        GpuModel("a100-80gb", "NVIDIA A100-SXM4-80GB", 80 * GI, "Ampere", "8.0", _mig(10, 40, 80, "20")),
        GpuModel("l4", "NVIDIA L4", 24 * GI, "Ada Lovelace", "8.9"),
        GpuModel("l40s", "NVIDIA L40S", 48 * GI, "Ada Lovelace", "8.9"),
    )
}


def by_product_name(product_name: str) -> GpuModel | None:
    return next((m for m in MODELS.values() if m.product_name == product_name), None)
