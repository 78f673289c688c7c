"""One physical GPU as the node agent sees it, whichever backend found it."""

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

    def mig_profile(self, name: str) -> MigProfile | None:
        return next((p for p in self.mig_profiles if p.name == name), None)
