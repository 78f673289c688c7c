"""A stand-in for ``libnvidia-ml.so.1`` under the real ``pynvml`` (nvidia-ml-py).

Only the C library is replaced: pynvml looks every function up on ``pynvml.nvmlLib``, so its
own wrappers run as on a GPU node. The NVML backend then sees pynvml's real return types
(``c_nvmlDevice_t`` handles, ``str`` names, ``c_nvmlGpuInstanceProfileInfo_v2_t``, a
``c_uint`` from ``nvmlDeviceIsMigDeviceHandle``) and its real exceptions
(``NVMLError_NotSupported`` and friends, made from the return codes by ``_nvmlCheckReturn``).
Each function takes what pynvml passes the C function (``byref`` out-parameters, arrays,
``c_uint``); an argument the C function takes as a pointer but that arrives by value fails as the
real library would misread it. Every call is recorded, and calls that change a GPU are listed in
``WRITES``: the read-only check asserts it made none.

The GPUs are described as NVML reports them: names as ``nvmlDeviceGetName`` gives them, PCI bus ids
in NVML's ``%08X:%02X:%02X.0`` form, MIG profiles with NVML's enum (``NVML_GPU_INSTANCE_PROFILE_*``),
its id and its placement table.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pynvml

from gpuslice.inventory.catalog import MODELS, GpuModel
from tests.unit.agent.libnvml_topology import TopologyCalls

WRITES = frozenset({
    "nvmlDeviceSetMigMode", "nvmlDeviceCreateGpuInstance", "nvmlDeviceCreateGpuInstanceWithPlacement",
    "nvmlGpuInstanceCreateComputeInstance", "nvmlGpuInstanceCreateComputeInstanceWithPlacement",
    "nvmlComputeInstanceDestroy", "nvmlGpuInstanceDestroy", "nvmlDeviceResetGpuLockedClocks",
    "nvmlDeviceSetComputeMode", "nvmlDeviceSetPersistenceMode", "nvmlDeviceSetPowerManagementLimit",
    "nvmlDeviceClearEccErrorCounts", "nvmlDeviceSetEccMode", "nvmlDeviceSetGpuLockedClocks",
})
# NVML's enums for the seven-slice family, in catalog order (1g, 1g+me, 1g double, 2g, 3g, 4g, 7g).
PROFILE_ENUMS = (pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1,
                 pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2, pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE,
                 pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE, pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE,
                 pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE)
PROFILE_IDS = (19, 20, 15, 14, 9, 5, 0)  # what `nvidia-smi mig -lgip` shows as ID for each
CI_SLICES = {pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE: 1, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE: 2,
             pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE: 3, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE: 4,
             pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE: 7}
ARCH = {"Ampere": pynvml.NVML_DEVICE_ARCH_AMPERE, "Hopper": pynvml.NVML_DEVICE_ARCH_HOPPER,
        "Ada Lovelace": pynvml.NVML_DEVICE_ARCH_ADA}
OK = pynvml.NVML_SUCCESS


@dataclass
class GpuInstance:
    gpu: FakeGpu
    id: int
    profile_id: int
    start: int
    size: int
    handle: Any = None
    cis: dict[int, ComputeInstance] = field(default_factory=dict)


@dataclass
class ComputeInstance:
    gi: GpuInstance
    id: int
    profile_id: int
    uuid: str
    handle: Any = None
    device: Any = None  # the MIG device's handle
    processes: list[tuple[int, int, bool]] = field(default_factory=list)  # as FakeGpu's, on this MIG device


@dataclass
class FakeGpu:
    model: GpuModel
    uuid: str
    bus: int
    minor: int
    mig_mode: int = 0  # current
    pending: int | None = None  # the mode set below Hopper, which only a GPU reset makes current
    lost: bool = False
    memory_supported: bool = True  # False: nvmlDeviceGetMemoryInfo answers NOT_SUPPORTED
    unplaceable: frozenset[int] = frozenset()  # profile ids whose placements answer NOT_SUPPORTED
    gis: dict[int, GpuInstance] = field(default_factory=dict)
    handle: Any = None
    # (pid, bytes, MPS client?) and utilisation samples (pid, timestamp in us, SM percent)
    processes: list[tuple[int, int, bool]] = field(default_factory=list)
    samples: list[tuple[int, int, int]] = field(default_factory=list)
    # Topology (libnvml_topology): NVLinks (None: the GPU has none), the NUMA nodes NVML's memory
    # affinity names (None: not supported), links whose far end NVML cannot read.
    links: list[tuple[int, int] | None] | None = None
    affinity: tuple[int, ...] | None = None
    unreadable_links: frozenset[int] = frozenset()


def _address(pointer: Any) -> int | None:
    return ctypes.cast(pointer, ctypes.c_void_p).value


def _set(ref: Any, value: Any) -> None:
    ref._obj.value = value


class FakeLibNvml(TopologyCalls):
    def __init__(self, gpus: list[tuple[str, bool]], driver: str = "580.95.05", cuda: int = 13000,
                 fail_init: int | None = None) -> None:
        """``gpus``: (catalog model, MIG mode on) per GPU, indexed in order."""
        self.driver, self.cuda, self.fail_init = driver, cuda, fail_init
        self.privileged = True  # False: a user NVML refuses its privileged queries (NO_PERMISSION)
        self.missing: set[str] = set()  # symbols this driver's library lacks (an older driver)
        self.calls: list[str] = []
        self._keep: list[Any] = []  # the opaque structures handles point at
        self.gpus = [FakeGpu(MODELS[model], f"GPU-{index:08x}-aaaa-bbbb-cccc-{index:012x}", 0x18 + 0x10 * index,
                             index, mig_mode=int(mig)) for index, (model, mig) in enumerate(gpus)]
        for gpu in self.gpus:
            gpu.handle = self._opaque(pynvml.struct_c_nvmlDevice_t)
        self.serial = 0

    # Plumbing

    def _opaque(self, kind: type[ctypes.Structure]) -> int:
        thing = kind()
        self._keep.append(thing)
        return ctypes.addressof(thing)

    def _point(self, ref: Any, address: int) -> None:
        pointer_type = type(ref._obj)
        ref._obj.contents = ctypes.cast(ctypes.c_void_p(address), pointer_type).contents

    def __getattr__(self, name: str) -> Any:
        method = getattr(type(self), f"_{name}", None)
        if method is None or name in self.missing:
            raise AttributeError(name)  # pynvml answers NVML_ERROR_FUNCTION_NOT_FOUND

        def call(*args: Any) -> int:
            self.calls.append(name)
            return int(method(self, *args))

        return call

    @property
    def writes(self) -> list[str]:
        return [c for c in self.calls if c in WRITES]

    def _gpu(self, handle: Any) -> FakeGpu | None:
        address = _address(handle)
        return next((g for g in self.gpus if g.handle == address), None)

    def _mig(self, handle: Any) -> ComputeInstance | None:
        address = _address(handle)
        return next((ci for g in self.gpus for gi in g.gis.values() for ci in gi.cis.values() if ci.device == address),
                    None)

    def _gi(self, handle: Any) -> GpuInstance | None:
        address = _address(handle)
        return next((gi for g in self.gpus for gi in g.gis.values() if gi.handle == address), None)

    def _ci(self, handle: Any) -> ComputeInstance | None:
        address = _address(handle)
        return next((ci for g in self.gpus for gi in g.gis.values() for ci in gi.cis.values() if ci.handle == address),
                    None)

    def _profile(self, gpu: FakeGpu, enum: int) -> tuple[int, Any] | None:
        """(position in the catalog's family, the catalog's profile) for NVML's enum."""
        if not gpu.model.mig_profiles or enum not in PROFILE_ENUMS:
            return None
        position = PROFILE_ENUMS.index(enum)
        return position, gpu.model.mig_profiles[position]

    def _by_id(self, gpu: FakeGpu, profile_id: int) -> tuple[int, Any] | None:
        if profile_id not in PROFILE_IDS or not gpu.model.mig_profiles:
            return None
        position = PROFILE_IDS.index(profile_id)
        return position, gpu.model.mig_profiles[position]

    # Library

    def _nvmlInitWithFlags(self, flags: int) -> int:
        return self.fail_init if self.fail_init is not None else OK

    def _nvmlShutdown(self) -> int:
        return OK

    def _nvmlSystemGetDriverVersion(self, buffer: Any, size: Any) -> int:
        buffer.value = self.driver.encode()
        return OK

    def _nvmlSystemGetCudaDriverVersion(self, ref: Any) -> int:
        _set(ref, self.cuda)
        return OK

    # Devices

    def _nvmlDeviceGetCount_v2(self, ref: Any) -> int:
        _set(ref, len(self.gpus))
        return OK

    def _nvmlDeviceGetHandleByIndex_v2(self, index: Any, ref: Any) -> int:
        if not 0 <= index.value < len(self.gpus):
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        self._point(ref, self.gpus[index.value].handle)
        return OK

    def _nvmlDeviceGetHandleByUUID(self, uuid: Any, ref: Any) -> int:
        gpu = next((g for g in self.gpus if g.uuid.encode() == uuid.value), None)
        if gpu is None:
            return pynvml.NVML_ERROR_NOT_FOUND
        self._point(ref, gpu.handle)
        return OK

    def _nvmlDeviceGetName(self, handle: Any, buffer: Any, size: Any) -> int:
        if (mig := self._mig(handle)) is not None:
            profile = self._by_id(mig.gi.gpu, mig.gi.profile_id)
            buffer.value = f"{mig.gi.gpu.model.product_name} MIG {profile[1].name if profile else '?'}".encode()
            return OK
        gpu = self._gpu(handle)
        if gpu is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        buffer.value = gpu.model.product_name.encode()
        return OK

    def _nvmlDeviceGetUUID(self, handle: Any, buffer: Any, size: Any) -> int:
        if (mig := self._mig(handle)) is not None:
            buffer.value = mig.uuid.encode()
            return OK
        gpu = self._gpu(handle)
        if gpu is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        buffer.value = gpu.uuid.encode()
        return OK

    def _nvmlDeviceGetIndex(self, handle: Any, ref: Any) -> int:
        gpu = self._gpu(handle)
        if gpu is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        _set(ref, self.gpus.index(gpu))
        return OK

    def _nvmlDeviceGetMinorNumber(self, handle: Any, ref: Any) -> int:
        gpu = self._gpu(handle)
        if gpu is None:
            return pynvml.NVML_ERROR_NOT_SUPPORTED  # a MIG device has no minor of its own
        _set(ref, gpu.minor)
        return OK

    def _nvmlDeviceGetBrand(self, handle: Any, ref: Any) -> int:
        _set(ref, pynvml.NVML_BRAND_NVIDIA)
        return OK

    def _nvmlDeviceGetArchitecture(self, handle: Any, ref: Any) -> int:
        gpu = self._gpu(handle)
        if gpu is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        _set(ref, ARCH[gpu.model.architecture])
        return OK

    def _nvmlDeviceGetCudaComputeCapability(self, handle: Any, major: Any, minor: Any) -> int:
        gpu = self._gpu(handle)
        if gpu is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        one, two = gpu.model.compute_capability.split(".")
        _set(major, int(one))
        _set(minor, int(two))
        return OK

    def _nvmlDeviceGetMemoryInfo(self, handle: Any, ref: Any) -> int:
        if (mig := self._mig(handle)) is not None:
            profile = self._by_id(mig.gi.gpu, mig.gi.profile_id)
            ref._obj.total = profile[1].memory if profile else 0
            return OK
        gpu = self._gpu(handle)
        if gpu is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        if gpu.lost:
            return pynvml.NVML_ERROR_GPU_IS_LOST
        if not gpu.memory_supported:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        ref._obj.total = gpu.model.memory
        ref._obj.free = gpu.model.memory
        return OK

    def _nvmlDeviceGetPciInfo_v3(self, handle: Any, ref: Any) -> int:
        gpu = self._gpu(handle)
        if gpu is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        ref._obj.busId = f"00000000:{gpu.bus:02X}:00.0".encode()  # NVML's form: 8-digit domain, uppercase
        ref._obj.busIdLegacy = f"0000:{gpu.bus:02X}:00.0".encode()
        ref._obj.domain, ref._obj.bus, ref._obj.device = 0, gpu.bus, 0
        return OK

    # MIG

    def _nvmlDeviceGetMigMode(self, handle: Any, current: Any, pending: Any) -> int:
        gpu = self._gpu(handle)
        if gpu is not None and gpu.lost:
            return pynvml.NVML_ERROR_GPU_IS_LOST
        if gpu is None or not gpu.model.mig_capable:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        _set(current, gpu.mig_mode)
        _set(pending, gpu.mig_mode if gpu.pending is None else gpu.pending)
        return OK

    def _nvmlDeviceSetMigMode(self, handle: Any, mode: int, status: Any) -> int:
        gpu = self._gpu(handle)
        if gpu is None or not gpu.model.mig_capable:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        if gpu.gis and mode == pynvml.NVML_DEVICE_MIG_DISABLE:
            return pynvml.NVML_ERROR_IN_USE
        if ARCH[gpu.model.architecture] < pynvml.NVML_DEVICE_ARCH_HOPPER:
            # Below Hopper the mode is only pending until a GPU reset, which the GPU's clients
            # (nvidia-persistenced, DCGM) keep from happening: nvml.h's activationStatus IN_USE.
            gpu.pending = mode
            _set(status, pynvml.NVML_ERROR_IN_USE)
            return OK
        gpu.mig_mode = mode
        _set(status, OK)
        return OK

    def reset(self, index: int) -> None:
        """A GPU reset (``nvidia-smi -r``): a pending MIG mode becomes current."""
        gpu = self.gpus[index]
        if gpu.pending is not None:
            gpu.mig_mode, gpu.pending = gpu.pending, None

    def _nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Any, enum: int, ref: Any) -> int:
        """v1: on any MIG-capable GPU, whatever its MIG mode; no name in its structure."""
        gpu = self._gpu(handle)
        found = self._profile(gpu, enum) if gpu is not None else None
        if found is None:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        self._profile_info(ref._obj, *found)
        return OK

    def _nvmlDeviceGetGpuInstanceProfileInfoV(self, handle: Any, enum: int, ref: Any) -> int:
        """The versioned call: NOT_SUPPORTED "if device doesn't have MIG mode enabled" (nvml.h)."""
        gpu = self._gpu(handle)
        found = self._profile(gpu, enum) if gpu is not None else None
        if gpu is None or found is None or gpu.mig_mode != pynvml.NVML_DEVICE_MIG_ENABLE:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        self._profile_info(ref._obj, *found)
        ref._obj.name = f"MIG {found[1].name}".encode()
        return OK

    def _profile_info(self, info: Any, position: int, profile: Any) -> None:
        info.id, info.sliceCount, info.instanceCount = PROFILE_IDS[position], profile.compute_slices, profile.max_count
        info.memorySizeMB = profile.memory // 1024**2
        engines = profile.engines
        if engines is not None:
            info.multiprocessorCount, info.copyEngineCount = engines.multiprocessors, engines.copy_engines
            info.decoderCount, info.encoderCount = engines.decoders, engines.encoders
            info.jpegCount, info.ofaCount = engines.jpeg_engines, engines.ofa_engines

    def _nvmlDeviceGetGpuInstancePossiblePlacements_v2(self, handle: Any, profile_id: int, array: Any,
                                                       count: Any) -> int:
        gpu = self._gpu(handle)
        found = self._by_id(gpu, profile_id) if gpu is not None else None
        if found is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        if gpu is not None and profile_id in gpu.unplaceable:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        if not self.privileged:  # nvml.h: "Requires privileged user."
            return pynvml.NVML_ERROR_NO_PERMISSION
        starts = found[1].starts
        if count._obj.value < len(starts):
            return pynvml.NVML_ERROR_INSUFFICIENT_SIZE
        for i, start in enumerate(starts):
            array[i].start, array[i].size = start, found[1].size
        _set(count, len(starts))
        return OK

    def _nvmlDeviceCreateGpuInstanceWithPlacement(self, handle: Any, profile_id: int, placement: Any,
                                                  ref: Any) -> int:
        if isinstance(placement, ctypes.Structure):
            return pynvml.NVML_ERROR_INVALID_ARGUMENT  # by value: the C library would read it as an address
        placement = placement._obj if hasattr(placement, "_obj") else placement.contents
        gpu = self._gpu(handle)
        found = self._by_id(gpu, profile_id) if gpu is not None else None
        if gpu is None or found is None or gpu.mig_mode != pynvml.NVML_DEVICE_MIG_ENABLE:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        cells = set(range(placement.start, placement.start + placement.size))
        if placement.start not in found[1].starts or any(
                cells & set(range(g.start, g.start + g.size)) for g in gpu.gis.values()):
            return pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES  # what NVML answers for an occupied placement
        gi = GpuInstance(gpu, next(n for n in range(1, 64) if n not in gpu.gis), profile_id, placement.start,
                         placement.size)
        gi.handle = self._opaque(pynvml.struct_c_nvmlGpuInstance_t)
        gpu.gis[gi.id] = gi
        self._point(ref, gi.handle)
        return OK

    def _nvmlGpuInstanceGetInfo(self, handle: Any, ref: Any) -> int:
        gi = self._gi(handle)
        if gi is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        ref._obj.id, ref._obj.profileId = gi.id, gi.profile_id
        ref._obj.placement.start, ref._obj.placement.size = gi.start, gi.size
        return OK

    def _nvmlGpuInstanceGetComputeInstanceProfileInfoV(self, handle: Any, profile: int, engine: int,
                                                        ref: Any) -> int:
        gi = self._gi(handle)
        slices = CI_SLICES.get(profile)
        found = self._by_id(gi.gpu, gi.profile_id) if gi is not None else None
        if found is None or slices is None or slices > found[1].compute_slices:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        ref._obj.id, ref._obj.sliceCount = profile, slices
        return OK

    def _nvmlGpuInstanceCreateComputeInstance(self, handle: Any, profile_id: int, ref: Any) -> int:
        gi = self._gi(handle)
        if gi is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        self.serial += 1
        ci = ComputeInstance(gi, len(gi.cis), profile_id, f"MIG-{gi.gpu.minor:04x}{gi.id:04x}-0000-0000-0000-"
                                                        f"{self.serial:012x}")
        ci.handle = self._opaque(pynvml.struct_c_nvmlComputeInstance_t)
        ci.device = self._opaque(pynvml.struct_c_nvmlDevice_t)
        gi.cis[ci.id] = ci
        self._point(ref, ci.handle)
        return OK

    def _nvmlComputeInstanceGetInfo_v2(self, handle: Any, ref: Any) -> int:
        ci = self._ci(handle)
        if ci is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        ref._obj.id, ref._obj.profileId = ci.id, ci.profile_id
        return OK

    def _nvmlDeviceGetGpuInstances(self, handle: Any, profile_id: int, array: Any, count: Any) -> int:
        gpu = self._gpu(handle)
        if gpu is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        found = [gi for gi in gpu.gis.values() if gi.profile_id == profile_id]
        for i, gi in enumerate(found):
            array[i] = ctypes.cast(ctypes.c_void_p(gi.handle), pynvml.c_nvmlGpuInstance_t)
        _set(count, len(found))
        return OK

    def _nvmlGpuInstanceGetComputeInstances(self, handle: Any, profile_id: int, array: Any, count: Any) -> int:
        gi = self._gi(handle)
        if gi is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        found = [ci for ci in gi.cis.values() if ci.profile_id == profile_id]
        for i, ci in enumerate(found):
            array[i] = ctypes.cast(ctypes.c_void_p(ci.handle), pynvml.c_nvmlComputeInstance_t)
        _set(count, len(found))
        return OK

    # Processes, as the C library answers: with no array, the count and INSUFFICIENT_SIZE (or
    # SUCCESS when there are none); with an array of the size asked for, the entries.

    def _processes(self, handle: Any, count: Any, array: Any, mps: bool) -> int:
        gpu, mig = self._gpu(handle), self._mig(handle)
        if gpu is not None and gpu.lost:
            return pynvml.NVML_ERROR_GPU_IS_LOST
        if mig is not None:
            listed = mig.processes
        elif gpu is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        elif gpu.mig_mode == pynvml.NVML_DEVICE_MIG_ENABLE:
            # nvml.h: "In MIG mode, if device handle is provided, the API returns aggregate information,
            # only if the caller has appropriate privileges": every MIG device's processes.
            if not self.privileged:
                return pynvml.NVML_ERROR_NO_PERMISSION
            listed = [p for gi in gpu.gis.values() for ci in gi.cis.values() for p in ci.processes]
        else:
            listed = gpu.processes
        found = [(pid, used) for pid, used, client in listed if client == mps]
        if not found:
            _set(count, 0)
            return OK
        if array is None or count._obj.value < len(found):
            _set(count, len(found))
            return pynvml.NVML_ERROR_INSUFFICIENT_SIZE
        for i, (pid, used) in enumerate(found):
            array[i].pid, array[i].usedGpuMemory = pid, used
        _set(count, len(found))
        return OK

    def _nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Any, count: Any, array: Any) -> int:
        return self._processes(handle, count, array, mps=False)

    def _nvmlDeviceGetMPSComputeRunningProcesses_v3(self, handle: Any, count: Any, array: Any) -> int:
        return self._processes(handle, count, array, mps=True)

    # Before R510 (c_nvmlProcessInfo_v2_t: the same pid and usedGpuMemory).
    def _nvmlDeviceGetComputeRunningProcesses_v2(self, handle: Any, count: Any, array: Any) -> int:
        return self._processes(handle, count, array, mps=False)

    def _nvmlDeviceGetMPSComputeRunningProcesses_v2(self, handle: Any, count: Any, array: Any) -> int:
        return self._processes(handle, count, array, mps=True)

    def _nvmlDeviceGetProcessUtilization(self, handle: Any, array: Any, count: Any, since: Any) -> int:
        gpu = self._gpu(handle)
        if gpu is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        found = [s for s in gpu.samples if s[1] > since.value]
        if not found:
            return pynvml.NVML_ERROR_NOT_FOUND
        if array is None:
            _set(count, len(found))
            return pynvml.NVML_ERROR_INSUFFICIENT_SIZE
        for i, (pid, stamp, sm) in enumerate(found):
            array[i].pid, array[i].timeStamp, array[i].smUtil = pid, stamp, sm
        _set(count, len(found))
        return OK

    def _nvmlDeviceGetMaxMigDeviceCount(self, handle: Any, ref: Any) -> int:
        gpu = self._gpu(handle)
        _set(ref, 7 if gpu is not None and gpu.model.mig_capable else 0)
        return OK

    def _nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: Any, ref: Any) -> int:
        gpu = self._gpu(handle)
        cis = [ci for gi in sorted(gpu.gis.values(), key=lambda g: g.id) for ci in gi.cis.values()] if gpu else []
        if index.value >= len(cis):
            return pynvml.NVML_ERROR_NOT_FOUND
        self._point(ref, cis[index.value].device)
        return OK

    def _nvmlDeviceIsMigDeviceHandle(self, handle: Any, ref: Any) -> int:
        _set(ref, int(self._mig(handle) is not None))
        return OK

    def _nvmlDeviceGetGpuInstanceId(self, handle: Any, ref: Any) -> int:
        mig = self._mig(handle)
        if mig is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        _set(ref, mig.gi.id)
        return OK

    def _nvmlDeviceGetComputeInstanceId(self, handle: Any, ref: Any) -> int:
        mig = self._mig(handle)
        if mig is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        _set(ref, mig.id)
        return OK

    def _nvmlDeviceGetGpuInstanceById(self, handle: Any, gi_id: int, ref: Any) -> int:
        gpu = self._gpu(handle)
        if gpu is None or gi_id not in gpu.gis:
            return pynvml.NVML_ERROR_NOT_FOUND
        self._point(ref, gpu.gis[gi_id].handle)
        return OK

    def _nvmlGpuInstanceGetComputeInstanceById(self, handle: Any, ci_id: int, ref: Any) -> int:
        gi = self._gi(handle)
        if gi is None or ci_id not in gi.cis:
            return pynvml.NVML_ERROR_NOT_FOUND
        self._point(ref, gi.cis[ci_id].handle)
        return OK

    def _nvmlComputeInstanceDestroy(self, handle: Any) -> int:
        ci = self._ci(handle)
        if ci is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        del ci.gi.cis[ci.id]
        return OK

    def _nvmlGpuInstanceDestroy(self, handle: Any) -> int:
        gi = self._gi(handle)
        if gi is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        if gi.cis:
            return pynvml.NVML_ERROR_IN_USE
        del gi.gpu.gis[gi.id]
        return OK

    # Events

    def _nvmlEventSetCreate(self, ref: Any) -> int:
        self._point(ref, self._opaque(pynvml.struct_c_nvmlEventSet_t))
        return OK

    def _nvmlDeviceRegisterEvents(self, handle: Any, types: Any, event_set: Any) -> int:
        return OK

    def _nvmlEventSetWait_v2(self, event_set: Any, ref: Any, timeout: Any) -> int:
        return pynvml.NVML_ERROR_TIMEOUT


@contextlib.contextmanager
def installed(lib: FakeLibNvml) -> Iterator[FakeLibNvml]:
    """pynvml's functions on ``lib`` for the duration (the real library is never loaded)."""
    before = pynvml.nvmlLib
    pynvml.nvmlLib = lib
    pynvml._nvmlGetFunctionPointer_cache.clear()
    try:
        yield lib
    finally:
        pynvml.nvmlLib = before
        pynvml._nvmlGetFunctionPointer_cache.clear()
