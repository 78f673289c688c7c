"""GPU backends: NVML on real nodes, a fake one for kind and the dev cluster.

A backend finds the node's GPUs, and for the kubelet plugin and the MIG manager
it also makes and removes MIG instances, switches MIG mode, reports faults, and
says what a container needs to reach a device beyond gpuslice's own variables
(on NVIDIA nodes: the NVIDIA Container Toolkit's CDI device, MIG capability
nodes). Every call may block (NVML is synchronous): callers run them in a thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from gpuslice.dra.cdi import ContainerEdits
from gpuslice.errors import GpusliceError
from gpuslice.inventory.catalog import MigProfile
from gpuslice.inventory.gpus import Gpu
from gpuslice.planning.grants import Grant
from gpuslice.planning.node.gpu_use import GpuProcess
from gpuslice.planning.node.health import Fault

__all__ = ["Access", "Fault", "GpuBackend", "GpuBackendError", "GpuProcess", "MigInstance"]


class GpuBackendError(GpusliceError):
    """The backend cannot see the GPUs, or refused an operation; the message says why and what to do."""


@dataclass(frozen=True)
class MigInstance:
    """A MIG instance that exists on a GPU: a GPU instance at a placement, with one compute instance.

    The placement (``start``, ``size`` in memory slices) and profile are what a published device
    names; ``gi``, ``ci`` and ``uuid`` are what the GPU gave it (they change when it is remade).
    """

    gpu_uuid: str
    profile: str
    start: int
    size: int
    gi: int
    ci: int
    uuid: str

    @property
    def placement(self) -> tuple[int, int]:
        return (self.start, self.size)


@dataclass(frozen=True)
class Access:
    """What a container needs to use a device, beyond gpuslice's ``GPUSLICE_*`` variables, written
    into the claim's own CDI spec: the device's edits (on NVIDIA nodes its device nodes) and the
    edits every device of the claim shares (the NVIDIA Container Toolkit's libraries and hooks)."""

    edits: ContainerEdits = field(default_factory=ContainerEdits)
    common: ContainerEdits | None = None


class GpuBackend(Protocol):
    name: str

    def discover(self) -> list[Gpu]:
        """The node's GPUs, ordered by index."""
        ...

    def mig_enabled(self, gpu: Gpu) -> bool: ...

    def set_mig_mode(self, gpu: Gpu, enabled: bool) -> None:
        """Switch MIG mode; GpuBackendError if it cannot happen now (the GPU is busy, needs a reset)."""
        ...

    def mig_instances(self, gpu: Gpu) -> list[MigInstance]:
        """The MIG instances that exist on ``gpu`` now (none when MIG is off)."""
        ...

    def create_mig(self, gpu: Gpu, profile: MigProfile, start: int) -> MigInstance:
        """A GPU instance of ``profile`` at memory slice ``start`` and a compute instance spanning it."""
        ...

    def destroy_mig(self, gpu: Gpu, instance: MigInstance) -> None:
        """Remove the instance (compute instances first); GpuBackendError if it is in use."""
        ...

    def faults(self) -> dict[str, Fault]:
        """GPUs that reported a fault since the last call, or still report one, by UUID."""
        ...

    def access(self, grant: Grant, gpu: Gpu, instance: MigInstance | None) -> Access:
        """What a container needs to reach ``grant``'s device (see :class:`Access`)."""
        ...

    def container_problems(self) -> list[str]:
        """What keeps a container from being given this node's devices at all (checked at start,
        so that the first prepare is not where it shows); empty when nothing does."""
        ...

    def processes(self, gpu: Gpu) -> list[GpuProcess]:
        """The processes using ``gpu`` now (its MIG devices' included): pid as the node's (the
        host's) PID namespace numbers it, device memory, and the share of the SMs each kept busy
        since the last call where the GPU reports it."""
        ...

    def mps_commands(self, shm: Path) -> tuple[list[str], list[str]]:
        """How to run an MPS control daemon in the foreground whose ``/dev/shm`` is ``shm``, and its
        control client (stdin: commands such as ``quit``); both read ``CUDA_MPS_PIPE_DIRECTORY``.
        GpuBackendError when this node has no MPS."""
        ...
