"""``mig`` devices: a MIG instance at the allocated placement.

Dynamic MIG (``profiles``) makes the GPU instance and its compute instance when the
claim is prepared and destroys them when it is unprepared. The scheduler never
allocates overlapping placements (they consume the same ``memory-slice-<i>``
counters) and the GPU's lock orders the calls, so two claims never race for one
placement. A static layout's instances are made by the MIG manager; prepare only
finds the one the device names. Admin access never makes or destroys anything.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuslice.agent.gpus import GpuBackendError, MigInstance
from gpuslice.agent.killpoints import kill_point
from gpuslice.agent.kubeletplugin.errors import DeviceUnusable, present_gpu
from gpuslice.agent.node_state.checkpoint import MigRecord, PreparedDevice
from gpuslice.agent.node_state.gpuops import GpuOps
from gpuslice.planning.devices import Device


def find(instances: list[MigInstance], record: MigRecord) -> MigInstance | None:
    return next((i for i in instances if i.profile == record.profile and i.start == record.start), None)


@dataclass(frozen=True)
class MigPrep:
    def plan(self, device: Device, admin_access: bool, static: bool) -> MigRecord | None:
        if device.profile is None or device.placement is None:
            raise DeviceUnusable(f"device {device.name} is a MIG device without a profile or placement in its"
                                 " published attributes; it was not published by this version of gpuslice.")
        start, size = device.placement
        return MigRecord(profile=device.profile, start=start, size=size, created=not (admin_access or static))

    async def prepare(self, ops: GpuOps, record: PreparedDevice) -> MigInstance | None:
        assert record.mig is not None
        gpu = present_gpu(ops, record.gpu_uuid, record.device)
        profile = gpu.mig_profile(record.mig.profile)
        if profile is None:
            raise DeviceUnusable(f"GPU {gpu.index} ({gpu.uuid}) has no MIG profile {record.mig.profile} for device"
                                 f" {record.device}.")
        async with ops.lock(gpu.uuid):
            try:
                existing = find(await ops.call(ops.backend.mig_instances, gpu), record.mig)
                if existing is not None or not record.mig.created:
                    if existing is None and not record.admin_access:
                        raise DeviceUnusable(
                            f"the {record.mig.profile} instance at memory slice {record.mig.start} of GPU {gpu.index}"
                            f" ({gpu.uuid}) that device {record.device} stands for does not exist (the static MIG"
                            " layout is not applied yet, or it was destroyed); the agent re-applies the layout,"
                            " after which the kubelet's retry succeeds.")
                    return existing
                if not await ops.call(ops.backend.mig_enabled, gpu):
                    await ops.call(ops.backend.set_mig_mode, gpu, True)
                made = await ops.call(ops.backend.create_mig, gpu, profile, record.mig.start)
            except GpuBackendError as error:
                raise DeviceUnusable(f"device {record.device}: {error}") from error
            kill_point("prepare-mig-created")
            return made

    async def unprepare(self, ops: GpuOps, record: PreparedDevice) -> None:
        if record.mig is None or not record.mig.created:
            return
        gpu = ops.gpus.get(record.gpu_uuid)
        if gpu is None:
            return  # the GPU is gone, and its instances with it
        async with ops.lock(gpu.uuid):
            instance = find(await ops.call(ops.backend.mig_instances, gpu), record.mig)
            if instance is not None and (record.mig.gi is None or instance.gi == record.mig.gi):
                await ops.call(ops.backend.destroy_mig, gpu, instance)
                kill_point("unprepare-mig-destroyed")


PREP = MigPrep()
