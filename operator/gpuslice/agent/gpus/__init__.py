"""GPU backends: NVML on real nodes, a fake one for kind and the dev cluster."""

from __future__ import annotations

from typing import Protocol

from gpuslice.inventory.gpus import Gpu


class GpuBackendError(Exception):
    """The backend cannot see the GPUs; the message says why and what to do."""


class GpuBackend(Protocol):
    name: str

    def discover(self) -> list[Gpu]:
        """The node's GPUs, ordered by index."""
        ...
