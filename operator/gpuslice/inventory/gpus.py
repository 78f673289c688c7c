"""One physical GPU as the node agent sees it, whichever backend found it.

``pci_bus_id`` is in the standard form (``0000:3b:00.0``, ``inventory.pci``), never NVML's.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuslice.inventory.catalog import MigProfile


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    product_name: str
    memory: int  # bytes
    pci_bus_id: str
    architecture: str
    compute_capability: str
    driver_version: str
    minor: int
    mig_capable: bool = False
    mig_enabled: bool = False
    mig_profiles: tuple[MigProfile, ...] = ()
    # NVIDIA's device attributes (planning.attributes): go-nvlib's brand string, the CUDA version
    # the driver supports ("13.0"), and the PCIe root complex (None where sysfs does not say).
    brand: str = "Unknown"
    cuda_driver_version: str = ""
    pcie_root: str | None = None
    # Where it sits (inventory.topology): the NUMA node of its PCI function and the NVLink domain it is
    # in; None where the backend cannot say (never guessed).
    numa_node: int | None = None
    nvlink_domain: str | None = None

    def mig_profile(self, name: str) -> MigProfile | None:
        return next((p for p in self.mig_profiles if p.name == name), None)
