"""``memory`` devices: a fixed slice of a GPU. Nothing is made on the GPU: the counter set the
slice consumes is what keeps slices within the GPU, at scheduling time."""

from __future__ import annotations

from dataclasses import dataclass

from gpuslice.agent.gpus import MigInstance
from gpuslice.agent.kubeletplugin.errors import present_gpu
from gpuslice.agent.node_state.checkpoint import MigRecord, PreparedDevice
from gpuslice.agent.node_state.gpuops import GpuOps
from gpuslice.planning.devices import Device


@dataclass(frozen=True)
class MemoryPrep:
    def plan(self, device: Device, admin_access: bool, static: bool) -> MigRecord | None:
        return None

    async def prepare(self, ops: GpuOps, record: PreparedDevice) -> MigInstance | None:
        present_gpu(ops, record.gpu_uuid, record.device)  # the GPU must still be there
        return None

    async def unprepare(self, ops: GpuOps, record: PreparedDevice) -> None:
        return None


PREP = MemoryPrep()
