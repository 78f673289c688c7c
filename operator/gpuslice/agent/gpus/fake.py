"""Fake GPUs with the figures of real models (catalog), for kind and the dev cluster.

Rich enough for every planner path: memory slicing, shared capacity and MIG
with NVML's real profiles and placement tables. UUIDs are stable per node and
index, so a restarted agent publishes the same devices.
"""

from __future__ import annotations

import hashlib
import uuid

from gpuslice.agent.gpus import GpuBackendError
from gpuslice.inventory.catalog import MODELS
from gpuslice.inventory.gpus import Gpu


def parse_fake_gpus(text: str) -> list[tuple[str, int]]:
    """``h100-80gb:8`` or ``h100-80gb:4,l4:2`` -> [(model, count), ...]."""
    parsed = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        model, _, count = part.partition(":")
        if model not in MODELS:
            raise GpuBackendError(f"--fake-gpus: unknown GPU model {model!r}; known: {', '.join(MODELS)}.")
        try:
            number = int(count or "1")
        except ValueError:
            raise GpuBackendError(f"--fake-gpus: {part!r} needs a count, e.g. {model}:8.") from None
        if not 1 <= number <= 16:
            raise GpuBackendError(f"--fake-gpus: {part!r}: count must be 1 to 16.")
        parsed.append((model, number))
    if not parsed:
        raise GpuBackendError("--fake-gpus is empty; give MODEL:COUNT, e.g. h100-80gb:8.")
    return parsed


class FakeBackend:
    name = "fake"

    def __init__(self, node: str, gpus: list[tuple[str, int]]) -> None:
        self.node = node
        self.gpus = gpus

    def discover(self) -> list[Gpu]:
        found: list[Gpu] = []
        for model_key, count in self.gpus:
            model = MODELS[model_key]
            for _ in range(count):
                index = len(found)
                seed = hashlib.sha256(f"{self.node}/{index}".encode()).digest()[:16]
                found.append(Gpu(
                    index=index,
                    uuid=f"GPU-{uuid.UUID(bytes=seed)}",
                    product_name=model.product_name,
                    memory=model.memory,
                    pci_bus_id=f"0000:{0x18 + 0x10 * index:02x}:00.0",
                    architecture=model.architecture,
                    compute_capability=model.compute_capability,
                    driver_version="580.95.05",
                    minor=index,
                    mig_capable=model.mig_capable,
                    mig_enabled=model.mig_capable,
                    mig_profiles=model.mig_profiles,
                ))
        return found
