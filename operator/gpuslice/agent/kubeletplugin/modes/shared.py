"""``shared`` devices: many claims on one GPU, each with the memory the scheduler accounted to it
(consumable capacity). Prepare records that share (the checkpoint keeps ``consumed_memory``
and the share id); nothing is made on the GPU."""

from __future__ import annotations

from dataclasses import dataclass

from gpuslice.agent.gpus import MigInstance
from gpuslice.agent.kubeletplugin.errors import DeviceUnusable, present_gpu
from gpuslice.agent.node_state.checkpoint import MigRecord, PreparedDevice
from gpuslice.agent.node_state.gpuops import GpuOps
from gpuslice.planning.devices import Device


@dataclass(frozen=True)
class SharedPrep:
    def plan(self, device: Device, admin_access: bool, static: bool) -> MigRecord | None:
        return None

    async def prepare(self, ops: GpuOps, record: PreparedDevice) -> MigInstance | None:
        present_gpu(ops, record.gpu_uuid, record.device)
        if record.consumed_memory is None and not record.admin_access:
            raise DeviceUnusable(f"device {record.device} is shared (consumable capacity), but the allocation"
                                 " records no consumed memory for this claim; the scheduler that allocated it does"
                                 " not support DRAConsumableCapacity. Use Kubernetes 1.36+ with the gate on.")
        return None

    async def unprepare(self, ops: GpuOps, record: PreparedDevice) -> None:
        return None


PREP = SharedPrep()
