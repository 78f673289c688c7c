"""The NVML adapter against a small stand-in for the pynvml module (only the adapter is
tested this way; everything above it runs on the fake backend)."""

from __future__ import annotations

import ctypes
import types
from pathlib import Path
from typing import Any

import pytest

from gpuslice.agent.gpus import GpuBackendError
from gpuslice.agent.gpus.nvml import NVML_LIBRARY, NvmlBackend, load_nvml_from


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


def mig_stand_in() -> types.ModuleType:
    """The stand-in, plus what MIG management and health use: GPU and compute instances kept per GPU,
    MIG device handles, and an event set."""
    nvml = stand_in()
    gpus: dict[int, dict[str, Any]] = {0: {"mode": 1, "gis": {}}, 1: {"mode": 1, "gis": {}}}

    class NotFound(nvml.NVMLError):  # type: ignore[name-defined,misc]
        pass

    class Timeout(nvml.NVMLError):  # type: ignore[name-defined,misc]
        pass

    class Array(type):
        def __mul__(cls, n: int) -> Any:
            return lambda: [None] * n

    def create_gi(handle: int, profile_id: int, placement: Any) -> Any:
        gis = gpus[handle]["gis"]
        gi = types.SimpleNamespace(id=len(gis) + 1, gpu=handle, profile_id=profile_id, cis={},
                                   placement=types.SimpleNamespace(start=placement.start, size=placement.size))
        gis[gi.id] = gi
        return gi

    def create_ci(gi: Any, profile_id: int) -> Any:
        ci = types.SimpleNamespace(id=len(gi.cis), gi=gi, uuid=f"MIG-{gi.gpu}-{gi.id}-{len(gi.cis)}")
        gi.cis[ci.id] = ci
        return ci

    def gpu_instances(handle: int, profile_id: int, array: Any, count_ref: Any) -> None:
        found = [g for g in gpus[handle]["gis"].values() if g.profile_id == profile_id]
        array[:len(found)] = found
        count_ref._obj.value = len(found)

    def compute_instances(gi: Any, profile_id: int, array: Any, count_ref: Any) -> None:
        array[:len(gi.cis)] = list(gi.cis.values())
        count_ref._obj.value = len(gi.cis)

    def by_id(handle: int, gi_id: int) -> Any:
        if gi_id not in gpus[handle]["gis"]:
            raise NotFound("Not Found")
        return gpus[handle]["gis"][gi_id]

    def mig_handle(handle: int, index: int) -> Any:
        cis = [ci for gi in gpus[handle]["gis"].values() for ci in gi.cis.values()]
        if index >= len(cis):
            raise NotFound("Not Found")
        return cis[index]

    def set_mig(handle: int, mode: int) -> int:
        gpus[handle]["mode"] = mode
        return 0

    nvml.__dict__.update(
        NVMLError_NotFound=NotFound, NVMLError_Timeout=Timeout, NVML_DEVICE_MIG_DISABLE=0,
        NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED=0, NVML_ERROR_GPU_IS_LOST=15,
        **{f"NVML_COMPUTE_INSTANCE_PROFILE_{n}_SLICE": n for n in (1, 2, 3, 4, 7)},
        c_nvmlGpuInstance_t=Array("gi", (), {}), c_nvmlComputeInstance_t=Array("ci", (), {}),
        nvmlDeviceGetHandleByUUID=lambda uuid: int(uuid.removeprefix("GPU-")),
        nvmlDeviceGetMigMode=lambda h: [gpus[h]["mode"], gpus[h]["mode"]], nvmlDeviceSetMigMode=set_mig,
        nvmlDeviceCreateGpuInstanceWithPlacement=create_gi,
        nvmlGpuInstanceGetComputeInstanceProfileInfo=lambda gi, p, e: types.SimpleNamespace(id=p),
        nvmlGpuInstanceCreateComputeInstance=create_ci,
        nvmlGpuInstanceGetInfo=lambda gi: gi, nvmlComputeInstanceGetInfo=lambda ci: ci,
        nvmlDeviceGetGpuInstances=gpu_instances, nvmlGpuInstanceGetComputeInstances=compute_instances,
        nvmlDeviceGetMaxMigDeviceCount=lambda h: 7, nvmlDeviceGetMigDeviceHandleByIndex=mig_handle,
        nvmlDeviceGetGpuInstanceId=lambda m: m.gi.id, nvmlDeviceGetComputeInstanceId=lambda m: m.id,
        nvmlDeviceGetUUID=lambda h: h.uuid if hasattr(h, "uuid") else f"GPU-{h}",
        nvmlDeviceGetGpuInstanceById=by_id,
        nvmlGpuInstanceGetComputeInstanceById=lambda gi, ci: gi.cis[ci],
        nvmlComputeInstanceDestroy=lambda ci: ci.gi.cis.pop(ci.id),
        nvmlGpuInstanceDestroy=lambda gi: gpus[gi.gpu]["gis"].pop(gi.id),
    )
    nvml.gpus = gpus  # type: ignore[attr-defined]
    return nvml


def test_makes_lists_and_destroys_mig_instances() -> None:
    nvml = mig_stand_in()
    backend = NvmlBackend(nvml)
    gpu = backend.discover()[1]
    three = gpu.mig_profile("3g.20gb")
    assert three is not None
    made = backend.create_mig(gpu, three, 4)
    assert (made.profile, made.start, made.size, made.gi, made.ci, made.uuid) == ("3g.20gb", 4, 4, 1, 0, "MIG-1-1-0")
    assert backend.mig_instances(gpu) == [made]
    backend.destroy_mig(gpu, made)
    assert backend.mig_instances(gpu) == []
    backend.destroy_mig(gpu, made)  # already gone: nothing to do

    backend.set_mig_mode(gpu, False)
    assert not backend.mig_enabled(gpu)
    assert backend.mig_instances(gpu) == [], "no instances without MIG mode"


def test_a_compute_instance_that_cannot_be_made_leaves_no_gpu_instance() -> None:
    nvml = mig_stand_in()

    def refuse(gi: Any, profile_id: int) -> Any:
        raise nvml.NVMLError("Insufficient Resources")

    nvml.nvmlGpuInstanceCreateComputeInstance = refuse  # type: ignore[attr-defined]
    backend = NvmlBackend(nvml)
    gpu = backend.discover()[0]
    one = gpu.mig_profile("1g.5gb")
    assert one is not None
    with pytest.raises(GpuBackendError, match=r"creating a 1g.5gb instance at memory slice 2 of GPU 0.*Insufficient"):
        backend.create_mig(gpu, one, 2)
    assert nvml.gpus[0]["gis"] == {}  # type: ignore[attr-defined]


def test_a_lost_gpu_and_xid_events_are_faults() -> None:
    nvml = mig_stand_in()
    backend = NvmlBackend(nvml)
    backend._watch_events = lambda: None  # type: ignore[method-assign]  # events are fed below

    class GpuIsLost(nvml.NVMLError):  # type: ignore[name-defined,misc]
        value = 15

    def memory(handle: Any) -> Any:
        if handle == 1:
            raise GpuIsLost("GPU is lost")
        return types.SimpleNamespace(total=40 * 1024**3)

    nvml.nvmlDeviceGetMemoryInfo = memory  # type: ignore[attr-defined]
    nvml.nvmlEventTypeXidCriticalError, nvml.nvmlEventTypeDoubleBitEccError = 8, 2  # type: ignore[attr-defined]
    faults = backend.faults()
    assert {uuid: (f.kind, f.reason) for uuid, f in faults.items()} == {"GPU-1": ("lost", "GPU-lost")}

    event = types.SimpleNamespace
    assert backend._fault_of(event(eventType=8, eventData=48)).reason == "XID-48"  # type: ignore[union-attr]
    assert backend._fault_of(event(eventType=8, eventData=79)).kind == "lost"  # type: ignore[union-attr]
    assert backend._fault_of(event(eventType=8, eventData=13)) is None, "an application's own error is no GPU fault"
    assert backend._fault_of(event(eventType=2, eventData=0)).kind == "ecc"  # type: ignore[union-attr]


def test_containers_get_the_nvidia_toolkits_cdi_devices(tmp_path: Any) -> None:
    from gpuslice.agent.gpus import MigInstance
    from gpuslice.agent.gpus.fake import FakeBackend
    from gpuslice.planning.grants import Grant
    from gpuslice.planning.node_pool import plan_node_pool
    from tests.unit.planning.test_node_pool import policy

    specs = tmp_path / "cdi"
    specs.mkdir()
    (specs / "nvidia.yaml").write_text(
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: GPU-0\n- name: '0'\n- name: '1'\n"
        "- name: MIG-static\ncontainerEdits: {}\n")
    minors = tmp_path / "mig-minors"
    minors.write_text("config 1\nmonitor 2\ngpu1/gi3/access 30\ngpu1/gi3/ci0/access 31\n")
    backend = NvmlBackend(mig_stand_in(), cdi_dirs=(specs,), mig_minors=minors)
    gpus = backend.discover()
    [device] = plan_node_pool({}, [gpus[0]], [policy("p", {"mode": "shared", "sliceSize": "5Gi"})]).typed
    grant = Grant("ns/c", "gpu", device)
    assert backend.access(grant, gpus[0], None).cdi_ids == ("nvidia.com/gpu=GPU-0",), "by UUID first"
    assert backend.access(grant, gpus[1], None).cdi_ids == ("nvidia.com/gpu=1",), "else by index"

    dynamic = MigInstance("GPU-1", "1g.5gb", 2, 1, gi=3, ci=0, uuid="MIG-new")
    access = backend.access(grant, gpus[1], dynamic)
    assert access.cdi_ids == ("nvidia.com/gpu=1",)
    assert [n.path for n in access.device_nodes] == ["/dev/nvidia-caps/nvidia-cap30", "/dev/nvidia-caps/nvidia-cap31"]
    assert access.env == {"CUDA_VISIBLE_DEVICES": "MIG-new"}
    static = MigInstance("GPU-1", "1g.5gb", 2, 1, gi=3, ci=0, uuid="MIG-static")
    assert backend.access(grant, gpus[1], static).cdi_ids == ("nvidia.com/gpu=MIG-static",)

    bare = NvmlBackend(mig_stand_in(), cdi_dirs=(tmp_path / "none",), mig_minors=minors)
    with pytest.raises(GpuBackendError, match=r"no NVIDIA Container Toolkit CDI spec .* names GPU 0.*nvidia-ctk cdi"):
        bare.access(grant, gpus[0], None)
    assert FakeBackend("n", [("l4", 1)]).access(grant, gpus[0], None).cdi_ids == ()


def test_nvml_is_loaded_from_the_drivers_root_where_the_driver_keeps_it(tmp_path: Path) -> None:
    # The GPU Operator's containerized driver (/run/nvidia/driver) on Ubuntu, mounted in the agent.
    library = tmp_path / "usr/lib/x86_64-linux-gnu" / NVML_LIBRARY
    library.parent.mkdir(parents=True)
    library.write_bytes(b"")
    loaded: list[tuple[str, int]] = []
    assert load_nvml_from(tmp_path, lambda path, mode: loaded.append((path, mode))) == library
    assert loaded == [(str(library), ctypes.RTLD_GLOBAL)]


def test_a_drivers_root_without_nvml_says_where_it_looked_and_what_to_set(tmp_path: Path) -> None:
    with pytest.raises(GpuBackendError) as refused:
        load_nvml_from(tmp_path)
    assert f"no libnvidia-ml.so.1 under --nvidia-driver-root {tmp_path}" in str(refused.value)
    assert "usr/lib64" in str(refused.value)
    assert "/run/nvidia/driver" in str(refused.value)


def test_a_file_that_is_no_library_is_refused_with_its_path(tmp_path: Path) -> None:
    library = tmp_path / "usr/lib64" / NVML_LIBRARY
    library.parent.mkdir(parents=True)
    library.write_text("not an ELF file")
    with pytest.raises(GpuBackendError) as refused:
        NvmlBackend(stand_in(), driver_root=tmp_path)  # the real loader, on a file it cannot load
    assert f"could not load NVML from {library}" in str(refused.value)
