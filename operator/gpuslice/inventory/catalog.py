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
class Engines:
    """A MIG instance's share of the GPU, as NVIDIA's DRA driver publishes it (capacities
    ``multiprocessors``, ``copyEngines``, ``decoders``, ``encoders``, ``jpegEngines``,
    ``ofaEngines``: ``CommonCapacitiesMig`` in its ``cmd/gpu-kubelet-plugin/mig.go``), from NVML's
    ``nvmlGpuInstanceProfileInfo_t``."""

    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int

    def capacities(self) -> tuple[tuple[str, int], ...]:
        return (("multiprocessors", self.multiprocessors), ("copyEngines", self.copy_engines),
                ("decoders", self.decoders), ("encoders", self.encoders), ("jpegEngines", self.jpeg_engines),
                ("ofaEngines", self.ofa_engines))


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
    engines: Engines | None = None  # what NVML's GpuInstanceProfileInfo says the instance has

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
    brand: str = "Nvidia"  # go-nvlib's name for NVML_BRAND_NVIDIA, what data-center GPUs report

    @property
    def mig_capable(self) -> bool:
        return bool(self.mig_profiles)

    def mig_profile(self, name: str) -> MigProfile | None:
        return next((p for p in self.mig_profiles if p.name == name), None)


Family = tuple[Engines, Engines, Engines, Engines, Engines, Engines, Engines]


def _mig(sizes_mib: tuple[int, int, int, int], names: tuple[int, int, int, int],
         engines: Family) -> tuple[MigProfile, ...]:
    """The seven-slice MIG family of A100/H100/H200: profile names by their GB figures (1g, 2g,
    3g, 7g), NVML's memory per profile in MiB and each profile's engines, with NVML's placement
    table (start memory slice, size in memory slices)."""
    one, two, four, full = (m * MI for m in sizes_mib)
    unit, double, big, whole = names
    e1, e1me, e1x2, e2, e3, e4, e7 = engines
    return (
        MigProfile(f"1g.{unit}gb", one, 7, 1, (0, 1, 2, 3, 4, 5, 6), engines=e1),
        MigProfile(f"1g.{unit}gb+me", one, 1, 1, (0, 1, 2, 3, 4, 5, 6), media=True, engines=e1me),
        MigProfile(f"1g.{double}gb", two, 4, 2, (0, 2, 4, 6), engines=e1x2),
        MigProfile(f"2g.{double}gb", two, 3, 2, (0, 2, 4), engines=e2),
        MigProfile(f"3g.{big}gb", four, 2, 4, (0, 4), engines=e3),
        MigProfile(f"4g.{big}gb", four, 1, 4, (0,), engines=e4),
        MigProfile(f"7g.{whole}gb", full, 1, 8, (0,), engines=e7),
    )


# (SMs, copy engines, decoders, encoders, JPEG, OFA) per profile, in _mig's order.
# Ampere: go-nvml's A100 mock (pkg/nvml/mock/gpus/a100.go), which is nvidia-smi's `mig -lgip`.
AMPERE: Family = (Engines(14, 1, 0, 0, 0, 0), Engines(14, 1, 1, 0, 1, 1), Engines(14, 1, 1, 0, 0, 0),
                  Engines(28, 2, 1, 0, 0, 0), Engines(42, 3, 2, 0, 0, 0), Engines(56, 4, 2, 0, 0, 0),
                  Engines(98, 7, 5, 0, 1, 1))
# Hopper (H100 SXM5, H200: 132 SMs): `nvidia-smi mig -lgip` of an H200 in NVIDIA/mig-parted#120 and
# of a GH200 in #139 for 1g to 4g; 7g has every SM and engine, as the 114-SM H100 PCIe's largest
# profile in NVIDIA/k8s-dra-driver-gpu PR #1018's log (114 SMs, 8 CE, 7 decoders, 7 JPEG, 1 OFA).
# `gpuslice agent --backend nvml --check` compares these with what the GPU reports.
HOPPER: Family = (Engines(16, 1, 1, 0, 1, 0), Engines(16, 1, 1, 0, 1, 1), Engines(26, 1, 1, 0, 1, 0),
                  Engines(32, 2, 2, 0, 2, 0), Engines(60, 3, 3, 0, 3, 0), Engines(64, 4, 4, 0, 4, 0),
                  Engines(132, 8, 7, 0, 7, 1))


MODELS: dict[str, GpuModel] = {
    model.key: model
    for model in (
        GpuModel("h100-80gb", "NVIDIA H100 80GB HBM3", 81559 * MI, "Hopper", "9.0",
                 _mig((9984, 20096, 40448, 81152), (10, 20, 40, 80), HOPPER)),
        GpuModel("h200-141gb", "NVIDIA H200", 143771 * MI, "Hopper", "9.0",
                 _mig((16384, 33024, 71168, 143104), (18, 35, 71, 141), HOPPER)),
        GpuModel("a100-40gb", "NVIDIA A100-SXM4-40GB", 40960 * MI, "Ampere", "8.0",
                 _mig((4864, 9856, 19968, 40192), (5, 10, 20, 40), AMPERE)),
        GpuModel("a100-80gb", "NVIDIA A100-SXM4-80GB", 81920 * MI, "Ampere", "8.0",
                 _mig((9728, 19968, 40192, 80896), (10, 20, 40, 80), AMPERE)),
        # MIG-capable, but its profile table (NVML's sizes per profile) is not known here, so the fake
        # GPU has none; 95,830 MiB is what nvidia-smi shows for one.
        GpuModel("h100-nvl", "NVIDIA H100 NVL", 95830 * MI, "Hopper", "9.0"),
        GpuModel("l4", "NVIDIA L4", 23034 * MI, "Ada Lovelace", "8.9"),
        GpuModel("l40s", "NVIDIA L40S", 46068 * MI, "Ada Lovelace", "8.9"),
    )
}
