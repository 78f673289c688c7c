"""The NVML adapter under the real pynvml, on a stand-in for the NVML C library (``libnvml``):
pynvml's own return types and exceptions, NVML's bus-id format and MIG handles. Only the
adapter is tested this way; everything above it runs on the fake backend."""

from __future__ import annotations

import ctypes
import types
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pynvml
import pytest

from gpuslice.agent.gpus import GpuBackendError
from gpuslice.agent.gpus.nvml import (
    COMPUTE_PROFILES,
    GI_PROFILES,
    NVML_LIBRARY,
    NvmlBackend,
    load_nvml_from,
    mig_memory_gb,
)
from gpuslice.agent.mig_manager import MigManager
from gpuslice.agent.node_state.gpuops import GpuOps
from gpuslice.inventory.catalog import MODELS
from gpuslice.planning.node.node_pool import plan_node_pool
from tests.builders import policy_model as policy
from tests.unit.agent.libnvml import PROFILE_IDS, FakeLibNvml, installed


@pytest.fixture
def a100s() -> Iterator[FakeLibNvml]:
    """Two A100 40GB in MIG mode, under the real pynvml."""
    with installed(FakeLibNvml([("a100-40gb", True), ("a100-40gb", True)])) as lib:
        yield lib


def test_discovers_gpus_with_mig_profiles_and_placements(a100s: FakeLibNvml, tmp_path: Path) -> None:
    (tmp_path / "bus/pci/devices").mkdir(parents=True)
    (tmp_path / "bus/pci/devices/0000:28:00.0").symlink_to("../../../devices/pci0000:27/0000:27:01.0/0000:28:00.0")
    gpus = NvmlBackend(pynvml, sysfs=tmp_path).discover()
    assert [g.uuid for g in gpus] == [g.uuid for g in a100s.gpus]
    gpu = gpus[1]
    assert (gpu.product_name, gpu.memory, gpu.architecture, gpu.compute_capability) == (
        "NVIDIA A100-SXM4-40GB", 40960 * 1024**2, "Ampere", "8.0")
    # NVML answers 00000000:28:00.0; the standard attribute is lowercase with a 4-digit domain.
    assert gpu.pci_bus_id == "0000:28:00.0"
    assert gpu.pcie_root == "pci0000:27"
    assert gpus[0].pcie_root is None, "no sysfs link: no pcieRoot (as deviceattribute)"
    assert (gpu.mig_capable, gpu.mig_enabled, gpu.driver_version) == (True, True, "580.95.05")
    assert (gpu.brand, gpu.cuda_driver_version, gpu.minor) == ("Nvidia", "13.0", 1)
    assert [(p.name, p.size, p.starts, p.max_count) for p in gpu.mig_profiles][:2] == [
        ("1g.5gb", 1, (0, 1, 2, 3, 4, 5, 6), 7), ("2g.10gb", 2, (0, 2, 4), 3)]
    assert sorted(gpu.mig_profiles, key=lambda p: p.name) == sorted(MODELS["a100-40gb"].mig_profiles,
                                                                     key=lambda p: p.name), "as the catalog says"
    assert {p.name: p.engines for p in gpu.mig_profiles} == {p.name: p.engines for p in MODELS["a100-40gb"].mig_profiles}


def test_gpu_without_mig() -> None:
    with installed(FakeLibNvml([("l4", False)])) as lib:
        [gpu] = NvmlBackend(pynvml).discover()
    assert (gpu.mig_capable, gpu.mig_profiles, gpu.architecture) == (False, (), "Ada Lovelace")
    assert not {"nvmlDeviceGetGpuInstanceProfileInfo", "nvmlDeviceGetGpuInstanceProfileInfoV"} & set(lib.calls), \
        "NotSupported from GetMigMode: no MIG probing"


@pytest.mark.parametrize("model", ["a100-40gb", "a100-80gb", "h100-80gb", "h200-141gb"])
def test_mig_profiles_of_a_gpu_whose_mig_mode_is_off(model: str) -> None:
    """NVML's versioned profile query answers NOT_SUPPORTED without MIG mode (the stand-in as nvml.h
    says): the profiles come from the v1 query, named as go-nvlib names them, and are the catalog's."""
    with installed(FakeLibNvml([(model, False)])) as lib:
        backend = NvmlBackend(pynvml)
        [gpu] = backend.discover()
        assert (gpu.mig_capable, gpu.mig_enabled) == (True, False)
        assert sorted(gpu.mig_profiles, key=lambda p: p.name) == sorted(MODELS[model].mig_profiles,
                                                                         key=lambda p: p.name)
        if gpu.architecture == "Ampere":
            return  # switched only at a reset: test_the_agent_never_switches_mig_mode_below_hopper
        backend.set_mig_mode(gpu, True)
        three = next(p for p in gpu.mig_profiles if p.name.startswith("3g."))
        made = backend.create_mig(gpu, three, 0)
        assert backend.mig_instances(gpu) == [made], "made and listed by the profiles read with MIG off"
        assert lib.gpus[0].mig_mode == pynvml.NVML_DEVICE_MIG_ENABLE


def test_the_agent_never_switches_mig_mode_below_hopper() -> None:
    """On an A100 NVML's SetMigMode only sets a pending mode while the GPU's clients hold it (the
    stand-in as nvml.h says: activationStatus IN_USE), which a later reset would make current
    unasked: the backend refuses before it reaches NVML, and says what to do."""
    with installed(FakeLibNvml([("a100-40gb", False), ("h100-80gb", False)])) as lib:
        backend = NvmlBackend(pynvml)
        a100, h100 = backend.discover()
        with pytest.raises(GpuBackendError, match=r"GPU 0 \(.*, Ampere\) switches MIG mode only at a GPU reset.*"
                                                  r"nvidia-smi -i 0 -mig 1"):
            backend.set_mig_mode(a100, True)
        assert lib.writes == []
        assert pynvml.nvmlDeviceGetMigMode(pynvml.nvmlDeviceGetHandleByIndex(0)) == [0, 0], "no pending mode set"
        backend.set_mig_mode(h100, True)
        assert backend.mig_enabled(h100), "Hopper switches without a reset"
        # The stand-in below Hopper, as NVML there: pending until a reset.
        pynvml.nvmlDeviceSetMigMode(pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.NVML_DEVICE_MIG_ENABLE)
        assert pynvml.nvmlDeviceGetMigMode(pynvml.nvmlDeviceGetHandleByIndex(0)) == [0, 1]
        assert not backend.mig_enabled(a100)
        lib.reset(0)
        assert backend.mig_enabled(a100)


def test_go_nvlibs_memory_rounding() -> None:
    """getMigMemorySizeGB: eighths of the GPU rounded up, then Go's half-away-from-zero rounding."""
    h200 = MODELS["h200-141gb"].memory
    assert mig_memory_gb(h200, 71168) == 71, "70.5 GiB: Go rounds half away from zero, Python's round() to even"
    assert mig_memory_gb(MODELS["a100-40gb"].memory, 4864) == 5


def test_a_profile_nvml_cannot_place_and_memory_nvml_does_not_report(a100s: FakeLibNvml) -> None:
    """NotSupported from the placements leaves that profile out, from the memory query takes the
    catalog's figure (NVIDIA's DRA driver goes on in both cases, nvlib.go); discovery never fails."""
    a100s.gpus[0].unplaceable = frozenset({PROFILE_IDS[4]})  # 3g.20gb
    a100s.gpus[1].memory_supported = False
    gpu0, gpu1 = NvmlBackend(pynvml).discover()
    assert "3g.20gb" not in {p.name for p in gpu0.mig_profiles}
    assert len(gpu0.mig_profiles) == len(MODELS["a100-40gb"].mig_profiles) - 1
    assert gpu1.memory == MODELS["a100-40gb"].memory, "the catalog's figure"
    assert sorted(p.name for p in gpu1.mig_profiles) == sorted(p.name for p in MODELS["a100-40gb"].mig_profiles), \
        "named with the catalog's memory"
    a100s.gpus[1].model = replace(a100s.gpus[1].model, product_name="NVIDIA A100-SXM4-40GB-X")
    unknown = NvmlBackend(pynvml).discover()[1]
    assert (unknown.memory, unknown.mig_profiles) == (0, ()), "no figure: nothing fits it, no MIG profile named"


def test_no_driver_gives_a_clear_message() -> None:
    with installed(FakeLibNvml([], fail_init=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)), pytest.raises(
            GpuBackendError, match=r"NVML could not start \(Driver Not Loaded\).*--backend fake"):
        NvmlBackend(pynvml).discover()


def test_gpu_lost_while_reading_gives_a_clear_message(a100s: FakeLibNvml) -> None:
    a100s.gpus[1].lost = True
    with pytest.raises(GpuBackendError, match=r"NVML failed while reading the GPUs \(GPU is lost\).*nvidia-smi"):
        NvmlBackend(pynvml).discover()


def test_makes_lists_and_destroys_mig_instances(a100s: FakeLibNvml) -> None:
    backend = NvmlBackend(pynvml)
    gpu = backend.discover()[1]
    three = gpu.mig_profile("3g.20gb")
    assert three is not None
    made = backend.create_mig(gpu, three, 4)
    uuid = next(iter(next(iter(a100s.gpus[1].gis.values())).cis.values())).uuid
    assert (made.profile, made.start, made.size, made.gi, made.ci, made.uuid) == ("3g.20gb", 4, 4, 1, 0, uuid)
    assert backend.mig_instances(gpu) == [made]
    backend.destroy_mig(gpu, made)
    assert backend.mig_instances(gpu) == []
    backend.destroy_mig(gpu, made)  # already gone: nothing to do

    a100s.gpus[1].mig_mode = pynvml.NVML_DEVICE_MIG_DISABLE  # an admin's switch and reset
    assert not backend.mig_enabled(gpu)
    assert backend.mig_instances(gpu) == [], "no instances without MIG mode"


def test_an_occupied_placement_is_refused_as_nvml_refuses_it(a100s: FakeLibNvml) -> None:
    backend = NvmlBackend(pynvml)
    gpu = backend.discover()[0]
    four = gpu.mig_profile("4g.20gb")
    one = gpu.mig_profile("1g.5gb")
    assert four is not None
    assert one is not None
    backend.create_mig(gpu, four, 0)
    with pytest.raises(GpuBackendError, match=r"Insufficient Resources|INSUFFICIENT_RESOURCES|NVML Error"):
        backend.create_mig(gpu, one, 2)


def test_a_compute_instance_that_cannot_be_made_leaves_no_gpu_instance(
        a100s: FakeLibNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    # On the class (the stand-in looks its functions up there), put back after the test.
    monkeypatch.setattr(type(a100s), "_nvmlGpuInstanceCreateComputeInstance",
                        lambda self, *args: pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
    backend = NvmlBackend(pynvml)
    gpu = backend.discover()[0]
    one = gpu.mig_profile("1g.5gb")
    assert one is not None
    with pytest.raises(GpuBackendError, match=r"creating a 1g.5gb instance at memory slice 2 of GPU 0"):
        backend.create_mig(gpu, one, 2)
    assert a100s.gpus[0].gis == {}


def test_a_lost_gpu_and_xid_events_are_faults(a100s: FakeLibNvml) -> None:
    backend = NvmlBackend(pynvml)
    backend._watch_events = lambda: None  # type: ignore[method-assign]  # events are fed below
    a100s.gpus[1].lost = True
    faults = backend.faults()
    assert {uuid: (f.kind, f.reason) for uuid, f in faults.items()} == {a100s.gpus[1].uuid: ("lost", "GPU-lost")}

    event = types.SimpleNamespace
    xid = pynvml.nvmlEventTypeXidCriticalError
    assert backend._fault_of(event(eventType=xid, eventData=48)).reason == "XID-48"  # type: ignore[union-attr]
    assert backend._fault_of(event(eventType=xid, eventData=79)).kind == "lost"  # type: ignore[union-attr]
    assert backend._fault_of(event(eventType=xid, eventData=13)) is None, "an application's own error is no GPU fault"
    ecc = pynvml.nvmlEventTypeDoubleBitEccError
    assert backend._fault_of(event(eventType=ecc, eventData=0)).kind == "ecc"  # type: ignore[union-attr]


def test_processes_with_mps_clients_and_their_sm_shares_since_the_last_read() -> None:
    lib = FakeLibNvml([("h100-80gb", False)])
    gpu = lib.gpus[0]
    gpu.processes = [(101, 2 * 1024**3, False), (202, 3 * 1024**3, True), (202, 3 * 1024**3, False)]
    gpu.samples = [(101, 10, 40), (101, 20, 60), (202, 20, 10)]
    with installed(lib):
        backend = NvmlBackend(pynvml)
        [found] = backend.discover()
        first = {p.pid: (p.used, p.sm) for p in backend.processes(found)}
        assert first == {101: (2 * 1024**3, 0.6), 202: (3 * 1024**3, 0.1)}, "an MPS client listed twice counts once"
        gpu.samples.append((101, 30, 5))
        again = {p.pid: p.sm for p in backend.processes(found)}
        assert again == {101: 0.05, 202: None}, "only the samples since the last read"
        gpu.processes = []
        assert backend.processes(found) == []
    assert "nvmlDeviceGetMPSComputeRunningProcesses_v3" in lib.calls
    assert lib.writes == []


def test_processes_of_a_gpu_in_mig_mode_are_counted_once_from_its_mig_devices(a100s: FakeLibNvml) -> None:
    """The parent's handle answers the aggregate of its MIG devices (nvml.h); adding it to theirs would
    charge every process twice, and report (or evict) a pod within its slice as overusing."""
    backend = NvmlBackend(pynvml)
    gpu = backend.discover()[0]
    three = gpu.mig_profile("3g.20gb")
    assert three is not None
    backend.create_mig(gpu, three, 0)
    backend.create_mig(gpu, three, 4)
    first, second = (ci for gi in sorted(a100s.gpus[0].gis.values(), key=lambda g: g.id) for ci in gi.cis.values())
    first.processes = [(101, 2 * 1024**3, False)]
    second.processes = [(202, 3 * 1024**3, True), (202, 3 * 1024**3, False)]
    assert {p.pid: p.used for p in backend.processes(gpu)} == {101: 2 * 1024**3, 202: 3 * 1024**3}
    a100s.privileged = False  # the aggregate is refused to others: the MIG devices still answer
    assert {p.pid: p.used for p in backend.processes(gpu)} == {101: 2 * 1024**3, 202: 3 * 1024**3}


def test_a_driver_before_r510_lists_processes_through_the_v2_calls_and_a_failing_gpu_is_that_gpus() -> None:
    """pynvml calls the _v3 symbols, which drivers before R510 lack (FunctionNotFound): the _v2 ones
    answer there. Any other NVML error is the GPU's: raised for it alone (the collector measures the others)."""
    lib = FakeLibNvml([("a100-40gb", False), ("a100-40gb", False)])
    lib.gpus[0].processes = [(101, 2 * 1024**3, False), (202, 3 * 1024**3, True)]
    lib.missing = {"nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetMPSComputeRunningProcesses_v3"}
    with installed(lib):
        backend = NvmlBackend(pynvml)
        first, second = backend.discover()
        assert {p.pid: p.used for p in backend.processes(first)} == {101: 2 * 1024**3, 202: 3 * 1024**3}
        assert {"nvmlDeviceGetComputeRunningProcesses_v2", "nvmlDeviceGetMPSComputeRunningProcesses_v2"} <= set(
            lib.calls)
        lib.gpus[1].lost = True
        with pytest.raises(GpuBackendError, match=r"reading the processes of GPU 1 \(GPU is lost\)"):
            backend.processes(second)
        assert len(backend.processes(first)) == 2
    assert lib.writes == []


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
        NvmlBackend(pynvml, driver_root=tmp_path)  # the real loader, on a file it cannot load
    assert f"could not load NVML from {library}" in str(refused.value)


async def test_a_static_layout_on_a_gpu_whose_mig_mode_is_off_enables_mig_and_publishes(tmp_path: Path) -> None:
    """The MIG manager on the NVML backend: the layout fits a Hopper GPU whose MIG mode is off (its
    profiles read with v1), so the GPU is switched to MIG mode and given the layout's instances,
    which publish."""
    with installed(FakeLibNvml([("h100-80gb", False)])) as lib:
        backend = NvmlBackend(pynvml)
        gpus = backend.discover()
        layout = policy("p", {"mode": "mig", "mig": {"layout": {"3g.40gb": 2}}})
        manager = MigManager("n", GpuOps(backend, gpus), tmp_path)
        adjusted = await manager.adjust(plan_node_pool({}, gpus, [layout]), [layout])
        assert list(manager.pending) == [gpus[0].uuid], "the layout fits a GPU whose MIG mode is off"
        assert adjusted.devices == [], "nothing published before the GPU has the instances"
        manager.statuses(set(), adjusted.devices)
        assert await manager.reconfigure(None, set(), adjusted.devices, refused=set())
        assert manager.failed == {}
        assert lib.gpus[0].mig_mode == pynvml.NVML_DEVICE_MIG_ENABLE
        assert [(i.profile, i.start) for i in backend.mig_instances(gpus[0])] == [("3g.40gb", 0), ("3g.40gb", 4)]
        gpus = await manager.refresh(gpus)
        published = await manager.adjust(plan_node_pool({}, gpus, [layout]), [layout])
        assert manager.pending == {}
        assert sorted((d.profile, d.placement) for d in published.typed) == [("3g.40gb", (0, 4)), ("3g.40gb", (4, 4))]
        instances = {i.start: i.uuid for i in backend.mig_instances(gpus[0])}
        assert {d["attributes"]["gpuslice.dev/placementStart"]["int"]: d["attributes"]["uuid"]["string"]
                for d in published.devices} == instances, "each with its instance's UUID, as NVIDIA's static devices"


async def test_an_ampere_gpu_whose_mig_mode_is_off_is_left_to_its_admin(tmp_path: Path) -> None:
    """An A100 with MIG mode off switches it only at a reset (planning.node.mig_mode): neither a static
    layout nor dynamic MIG publishes there, the MIG manager does not try, nothing reaches NVML, and
    the plan says why for the controller. Once an admin switched it and reset the GPU, the next
    cycle reads MIG mode on and the layout is applied."""
    with installed(FakeLibNvml([("a100-40gb", False)])) as lib:
        backend = NvmlBackend(pynvml)
        gpus = backend.discover()
        layout = policy("p", {"mode": "mig", "mig": {"layout": {"3g.20gb": 2}}})
        dynamic = policy("d", {"mode": "mig", "mig": {"profiles": ["1g.5gb"]}})
        manager = MigManager("n", GpuOps(backend, gpus), tmp_path)
        for mig in (layout, dynamic):
            plan = await manager.adjust(plan_node_pool({}, gpus, [mig]), [mig])
            assert (plan.devices, manager.pending) == ([], {})
            assert [(i.policy, i.reason, i.index) for i in plan.left_out] == [(mig.name, "MigModeOff", 0)]
            assert "switches it only at a GPU reset" in plan.notes[0]
        assert lib.writes == []
        lib.gpus[0].pending = pynvml.NVML_DEVICE_MIG_ENABLE
        lib.reset(0)
        gpus = await manager.refresh(gpus)
        assert gpus[0].mig_enabled
        plan = await manager.adjust(plan_node_pool({}, gpus, [layout]), [layout])
        assert plan.left_out == ()
        assert list(manager.pending) == [gpus[0].uuid], "now the layout is applied"


async def test_a_gpu_whose_mig_mode_cannot_be_read_keeps_the_last_one_known(tmp_path: Path) -> None:
    """One GPU fallen off the bus does not stop the node's publishing: its last MIG mode stands."""
    with installed(FakeLibNvml([("h100-80gb", True), ("h100-80gb", False)])) as lib:
        backend = NvmlBackend(pynvml)
        gpus = backend.discover()
        manager = MigManager("n", GpuOps(backend, gpus), tmp_path)
        lib.gpus[0].lost = True
        lib.gpus[0].mig_mode = pynvml.NVML_DEVICE_MIG_DISABLE  # not read: the GPU does not answer
        lib.gpus[1].mig_mode = pynvml.NVML_DEVICE_MIG_ENABLE
        assert [g.mig_enabled for g in await manager.refresh(gpus)] == [True, True]
        assert manager.ops.gpus[gpus[1].uuid].mig_enabled, "what prepare reads follows"


async def test_a_gpu_a_whole_gpu_policy_takes_loses_its_instances_and_on_hopper_its_mig_mode(
    tmp_path: Path,
) -> None:
    """A memory policy on GPUs in MIG mode (left from a mig policy or dynamic MIG): once nothing of a GPU is
    published or prepared, the agent destroys its MIG instances and switches MIG mode off on the H100, as
    NVIDIA's maybeDisableMigMode; never the A100's mode (a reset: it says the step), and nothing where the
    GPU Operator's MIG manager runs."""
    memory = policy("m", {"mode": "memory", "sliceSize": "10Gi"})
    with installed(FakeLibNvml([("h100-80gb", True), ("a100-40gb", True)])) as lib:
        backend = NvmlBackend(pynvml)
        gpus = backend.discover()
        manager = MigManager("n", GpuOps(backend, gpus), tmp_path)
        plan = plan_node_pool({}, gpus, [memory])
        assert [(i.reason, i.index) for i in plan.left_out] == [("MigModeOn", 0), ("MigModeOnNeedsReset", 1)]
        for gpu in gpus:
            backend.create_mig(gpu, gpu.mig_profiles[0], 0)
        assert [g.mig_enabled for g in await manager.release(gpus, plan, [memory], {}, {gpus[0].uuid, gpus[1].uuid})] \
            == [True, True], "a device of each GPU is still published or prepared"
        assert all(backend.mig_instances(g) for g in gpus)
        operator = {"nvidia.com/gpu.deploy.mig-manager": "true"}
        assert [g.mig_enabled for g in await manager.release(gpus, plan, [memory], operator, set())] == [True, True]
        assert all(backend.mig_instances(g) for g in gpus), "the GPU Operator's MIG manager owns MIG there"
        assert "nvmlDeviceSetMigMode" not in lib.writes
        released = await manager.release(gpus, plan, [memory], {}, set())
        assert [g.mig_enabled for g in released] == [False, True]
        assert [backend.mig_instances(g) for g in released] == [[], []], "both GPUs' instances destroyed"
        assert (lib.gpus[0].mig_mode, lib.gpus[1].mig_mode, lib.gpus[1].pending) == (0, 1, None), "no pending mode"
        assert manager.ops.gpus[gpus[0].uuid].mig_enabled is False, "what prepare reads follows"
        assert plan_node_pool({}, released, [memory]).left_out == (plan.left_out[1],), "the H100 publishes now"


def test_every_gpu_instance_size_has_a_compute_instance_profile() -> None:
    """create_mig makes a compute instance as large as its GPU instance: each size GI_PROFILES names
    (6 and 8 on GPUs of eight slices) has NVML's constant."""
    assert {slices for slices, _ in GI_PROFILES.values()} <= set(COMPUTE_PROFILES)
    assert all(hasattr(pynvml, name) for name in COMPUTE_PROFILES.values())
