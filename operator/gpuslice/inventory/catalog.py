"""Known GPU models, with the figures that slicing decisions depend on.

The fake backend pretends to be these GPUs, and the controller uses the same
figures to judge a policy against the nodes it selects. Memory is what NVML
reports on a current driver, not the nominal size: an "H100 80GB" has 81,559 MiB
(79.6 GiB), so a 10Gi policy gives it 7 slices, and a 10G (10^9 bytes) one 8.
MIG profile sizes are ``nvidia-smi mig -lgip``'s on R535+ drivers; they move a
little between drivers, which is why the NVML backend reads them from the GPU.
Sources: nvidia-smi output pasted in NVIDIA's MIG user guide, NVIDIA/mig-parted
issues #31 and #120, go-nvml's A100 mock (see docs/agent.md).
"""

from __future__ import annotations

from dataclasses import dataclass

GI = 1024**3
MI = 1024**2


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


def _mig(sizes_mib: tuple[int, int, int, int], names: tuple[int, int, int, int]) -> tuple[MigProfile, ...]:
    """The seven-slice MIG family of A100/H100/H200: profile names by their GB figures (1g, 2g,
    3g, 7g) and NVML's memory per profile in MiB, with NVML's placement table (start memory
    slice, size in memory slices)."""
    one, two, four, full = (m * MI for m in sizes_mib)
    unit, double, big, whole = names
    return (
        MigProfile(f"1g.{unit}gb", one, 7, 1, (0, 1, 2, 3, 4, 5, 6)),
        MigProfile(f"1g.{unit}gb+me", one, 1, 1, (0, 1, 2, 3, 4, 5, 6), media=True),
        MigProfile(f"1g.{double}gb", two, 4, 2, (0, 2, 4, 6)),
        MigProfile(f"2g.{double}gb", two, 3, 2, (0, 2, 4)),
        MigProfile(f"3g.{big}gb", four, 2, 4, (0, 4)),
        MigProfile(f"4g.{big}gb", four, 1, 4, (0,)),
        MigProfile(f"7g.{whole}gb", full, 1, 8, (0,)),
    )


MODELS: dict[str, GpuModel] = {
    model.key: model
    for model in (
        GpuModel("h100-80gb", "NVIDIA H100 80GB HBM3", 81559 * MI, "Hopper", "9.0",
                 _mig((9984, 20096, 40448, 81152), (10, 20, 40, 80))),
        GpuModel("h200-141gb", "NVIDIA H200", 143771 * MI, "Hopper", "9.0",
                 _mig((16384, 33024, 71168, 143104), (18, 35, 71, 141))),
        GpuModel("a100-40gb", "NVIDIA A100-SXM4-40GB", 40960 * MI, "Ampere", "8.0",
                 _mig((4864, 9856, 19968, 40192), (5, 10, 20, 40))),
        GpuModel("a100-80gb", "NVIDIA A100-SXM4-80GB", 81920 * MI, "Ampere", "8.0",
                 _mig((9728, 19968, 40192, 80896), (10, 20, 40, 80))),
        GpuModel("l4", "NVIDIA L4", 23034 * MI, "Ada Lovelace", "8.9"),
        GpuModel("l40s", "NVIDIA L40S", 46068 * MI, "Ada Lovelace", "8.9"),
    )
}
