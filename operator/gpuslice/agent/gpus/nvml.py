"""Real GPUs through NVML (``pynvml`` from nvidia-ml-py). Read-only: discovery never
changes a GPU setting; MIG instances are made by the kubelet plugin at prepare time."""

from __future__ import annotations

import ctypes
from types import ModuleType
from typing import Any

from gpuslice.agent.gpus import GpuBackendError
from gpuslice.inventory.catalog import MigProfile
from gpuslice.inventory.gpus import Gpu

ARCHITECTURES = {2: "Kepler", 3: "Maxwell", 4: "Pascal", 5: "Volta", 6: "Turing", 7: "Ampere",
                 8: "Ada Lovelace", 9: "Hopper", 10: "Blackwell", 13: "Rubin"}
MAX_PLACEMENTS = 16


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlBackend:
    name = "nvml"

    def __init__(self, nvml: ModuleType | None = None) -> None:
        if nvml is None:
            import pynvml

            nvml = pynvml
        self.nvml: Any = nvml  # pynvml is untyped; the stand-in in tests is a plain module

    def discover(self) -> list[Gpu]:
        nvml = self.nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as error:
            raise GpuBackendError(
                f"NVML could not start ({error}): no NVIDIA driver on this node, or the agent's container"
                " lacks the driver libraries. On a node without GPUs use --backend fake."
            ) from error
        try:
            driver = _text(nvml.nvmlSystemGetDriverVersion())
            return [self._gpu(index, driver) for index in range(nvml.nvmlDeviceGetCount())]
        except nvml.NVMLError as error:
            raise GpuBackendError(
                f"NVML failed while reading the GPUs ({error}). Check `nvidia-smi -q` on the node: a GPU"
                " that fell off the bus or needs a reset shows there; the agent publishes once NVML reads cleanly."
            ) from error
        finally:
            nvml.nvmlShutdown()

    def _gpu(self, index: int, driver: str) -> Gpu:
        nvml = self.nvml
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        major, minor_cc = nvml.nvmlDeviceGetCudaComputeCapability(handle)
        mig_capable, mig_enabled = False, False
        try:
            current, _pending = nvml.nvmlDeviceGetMigMode(handle)
            mig_capable, mig_enabled = True, current == nvml.NVML_DEVICE_MIG_ENABLE
        except nvml.NVMLError_NotSupported:
            pass
        return Gpu(
            index=index,
            uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
            product_name=_text(nvml.nvmlDeviceGetName(handle)),
            memory=int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
            pci_bus_id=_text(nvml.nvmlDeviceGetPciInfo(handle).busId),
            architecture=ARCHITECTURES.get(nvml.nvmlDeviceGetArchitecture(handle), "unknown"),
            compute_capability=f"{major}.{minor_cc}",
            driver_version=driver,
            minor=int(nvml.nvmlDeviceGetMinorNumber(handle)),
            mig_capable=mig_capable,
            mig_enabled=mig_enabled,
            mig_profiles=self._mig_profiles(handle) if mig_capable else (),
        )

    def _mig_profiles(self, handle: Any) -> tuple[MigProfile, ...]:
        nvml = self.nvml
        profiles = []
        for profile in range(nvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile)
            except (nvml.NVMLError_NotSupported, nvml.NVMLError_InvalidArgument):
                continue
            if not info.instanceCount:
                continue
            placements = (nvml.c_nvmlGpuInstancePlacement_t * MAX_PLACEMENTS)()
            count = ctypes.c_uint(MAX_PLACEMENTS)
            nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, info.id, placements, ctypes.byref(count))
            found = [(placements[i].start, placements[i].size) for i in range(count.value)]
            name = _text(info.name).removeprefix("MIG ").strip()
            profiles.append(MigProfile(
                name=name,
                memory=int(info.memorySizeMB) * 1024**2,
                max_count=int(info.instanceCount),
                size=found[0][1] if found else 0,
                starts=tuple(start for start, _ in found),
                media="+me" in name,
            ))
        return tuple(profiles)
