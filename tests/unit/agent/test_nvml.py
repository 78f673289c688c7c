"""The NVML adapter against a small stand-in for the pynvml module (only the adapter is
tested this way; everything above it runs on the fake backend)."""

from __future__ import annotations

import types
from typing import Any

import pytest

from gpuslice.agent.gpus import GpuBackendError
from gpuslice.agent.gpus.nvml import NvmlBackend


def stand_in(mig: bool = True, fail_init: bool = False) -> types.ModuleType:
    nvml = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    class NotSupported(NVMLError):
        pass

    class InvalidArgument(NVMLError):
        pass

    class Placement:
        def __init__(self) -> None:
            self.start, self.size = 0, 0

    def placements_array() -> Any:
        return [Placement() for _ in range(16)]

    profiles = {0: (1, 7, 4864, "MIG 1g.5gb", (0, 1, 2, 3, 4, 5, 6), 1), 2: (3, 2, 19968, "MIG 3g.20gb", (0, 4), 4)}

    def profile_info(handle: Any, profile: int) -> Any:
        if profile not in profiles:
            raise NotSupported()
        slices, count, mb, name, _, _ = profiles[profile]
        return types.SimpleNamespace(id=profile + 10, sliceCount=slices, instanceCount=count, memorySizeMB=mb,
                                     name=name.encode())

    def possible_placements(handle: Any, profile_id: int, array: Any, count_ref: Any) -> None:
        _, _, _, _, starts, size = profiles[profile_id - 10]
        for i, start in enumerate(starts):
            array[i].start, array[i].size = start, size
        count_ref._obj.value = len(starts)

    def init() -> None:
        if fail_init:
            raise NVMLError("Driver Not Loaded")

    def mig_mode(handle: Any) -> list[int]:
        if not mig:
            raise NotSupported()
        return [1, 1]

    nvml.__dict__.update(
        NVMLError=NVMLError, NVMLError_NotSupported=NotSupported, NVMLError_InvalidArgument=InvalidArgument,
        NVML_DEVICE_MIG_ENABLE=1, NVML_GPU_INSTANCE_PROFILE_COUNT=4,
        nvmlInit=init, nvmlShutdown=lambda: None, nvmlSystemGetDriverVersion=lambda: "580.95.05",
        nvmlDeviceGetCount=lambda: 2, nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetCudaComputeCapability=lambda h: (8, 0), nvmlDeviceGetMigMode=mig_mode,
        nvmlDeviceGetUUID=lambda h: f"GPU-{h}", nvmlDeviceGetName=lambda h: b"NVIDIA A100-SXM4-40GB",
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=40 * 1024**3),
        nvmlDeviceGetPciInfo=lambda h: types.SimpleNamespace(busId=f"00000000:{h + 7:02X}:00.0".encode()),
        nvmlDeviceGetArchitecture=lambda h: 7, nvmlDeviceGetMinorNumber=lambda h: h,
        nvmlDeviceGetGpuInstanceProfileInfo=profile_info,
        nvmlDeviceGetGpuInstancePossiblePlacements=possible_placements,
    )
    class ArrayOf(type):  # the adapter builds `(c_nvmlGpuInstancePlacement_t * 16)()`, as with ctypes
        def __mul__(cls, n: int) -> Any:
            return placements_array

    nvml.c_nvmlGpuInstancePlacement_t = ArrayOf("c_nvmlGpuInstancePlacement_t", (), {})  # type: ignore[attr-defined]
    return nvml


def test_discovers_gpus_with_mig_profiles_and_placements() -> None:
    gpus = NvmlBackend(stand_in()).discover()
    assert [g.uuid for g in gpus] == ["GPU-0", "GPU-1"]
    gpu = gpus[1]
    assert (gpu.product_name, gpu.memory, gpu.architecture, gpu.compute_capability) == (
        "NVIDIA A100-SXM4-40GB", 40 * 1024**3, "Ampere", "8.0")
    assert gpu.pci_bus_id == "00000000:08:00.0"
    assert (gpu.mig_capable, gpu.mig_enabled, gpu.driver_version) == (True, True, "580.95.05")
    assert [(p.name, p.size, p.starts, p.max_count) for p in gpu.mig_profiles] == [
        ("1g.5gb", 1, (0, 1, 2, 3, 4, 5, 6), 7), ("3g.20gb", 4, (0, 4), 2)]


def test_gpu_without_mig() -> None:
    [gpu, _] = NvmlBackend(stand_in(mig=False)).discover()
    assert (gpu.mig_capable, gpu.mig_profiles) == (False, ())


def test_no_driver_gives_a_clear_message() -> None:
    with pytest.raises(GpuBackendError, match=r"NVML could not start \(Driver Not Loaded\).*--backend fake"):
        NvmlBackend(stand_in(fail_init=True)).discover()


def test_gpu_lost_while_reading_gives_a_clear_message() -> None:
    nvml = stand_in()

    class GpuIsLost(nvml.NVMLError):  # type: ignore[name-defined,misc]
        pass

    def lost(handle: Any) -> Any:
        raise GpuIsLost("GPU is lost")

    nvml.nvmlDeviceGetMemoryInfo = lost  # type: ignore[attr-defined]
    with pytest.raises(GpuBackendError, match=r"NVML failed while reading the GPUs \(GPU is lost\).*nvidia-smi"):
        NvmlBackend(nvml).discover()
