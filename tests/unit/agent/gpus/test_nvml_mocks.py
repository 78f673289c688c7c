"""The NVML backend on NVIDIA's own mocks: go-nvml's DGX A100, H100, H200 and B200 behind NVML's C
ABI (gpuslice's ``hack/nvidia/mocknvml``), loaded by the real pynvml as the driver's library is.

``test_nvml.py`` runs the same backend on a Python stand-in for the C library, which can fail in ways
this library cannot (a symbol missing from an older driver, NO_PERMISSION for a user, a profile NVML
cannot place, memory NVML does not report); here every call crosses the real C ABI, with go-nvml's
structures, into state that other processes share."""

from __future__ import annotations

import ctypes
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pynvml
import pytest

from gpuslice.agent.check import READ_CALLS, run_check
from gpuslice.agent.gpus import GpuBackendError
from gpuslice.agent.gpus.nvml import NvmlBackend
from gpuslice.devcluster.mocknvml import ECC_EVENT, XID_EVENT, MockProcess
from gpuslice.inventory.catalog import MODELS
from tests.unit.agent.mocknvml_node import mock_node

GI = 1024**3
MODEL_NAMES = {"a100-40gb": "NVIDIA A100-SXM4-40GB", "h100-80gb": "NVIDIA H100 80GB HBM3", "h200-141gb": "NVIDIA H200",
               "b200-180gb": "NVIDIA B200 180GB HBM3e"}
UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
MIG_UUID = re.compile(r"^MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


@pytest.mark.parametrize("model", list(MODEL_NAMES))
def test_discovery_on_each_dgx_mock_is_the_catalogs_gpu(model: str, tmp_path: Path) -> None:
    with mock_node(tmp_path, model, count=8, mig=True) as node:
        # No sysfs for the mock's PCI functions (nor the host's, which may have some at those bus ids).
        gpus = NvmlBackend(pynvml, sysfs=tmp_path / "sys").discover()
        again = NvmlBackend(pynvml, sysfs=tmp_path / "sys").discover()
    assert len(gpus) == 8
    assert [g.uuid for g in gpus] == [g.uuid for g in again], "the same UUIDs in every process"
    assert all(UUID.match(g.uuid) for g in gpus)
    assert len({g.uuid for g in gpus}) == 8
    assert [g.minor for g in gpus] == list(range(8))
    assert len({g.pci_bus_id for g in gpus}) == 8
    assert all(re.match(r"^0000:[0-9a-f]{2}:00\.0$", g.pci_bus_id) for g in gpus)
    gpu = gpus[3]
    assert gpu.product_name == MODEL_NAMES[model]
    assert (gpu.mig_capable, gpu.mig_enabled, gpu.brand) == (True, True, "Nvidia")
    assert gpu.driver_version == ("560.28.03" if model == "b200-180gb" else "550.54.15")
    catalogued = MODELS.get(model)
    if catalogued is not None:
        assert gpu.memory == catalogued.memory, "memory as NVML reports it (81,559 MiB for an H100 80GB)"
        assert (gpu.architecture, gpu.compute_capability) == (catalogued.architecture, catalogued.compute_capability)
        assert sorted(gpu.mig_profiles, key=lambda p: p.name) == sorted(catalogued.mig_profiles, key=lambda p: p.name)
    else:  # go-nvml's own B200, with NVML's placements
        assert (gpu.architecture, gpu.compute_capability, gpu.memory) == ("Blackwell", "10.0", 184320 * 2**20)
        shapes = {p.name: (p.size, p.starts, p.max_count) for p in gpu.mig_profiles}
        assert shapes["7g.180gb"] == (8, (0,), 1)
        assert shapes["3g.90gb"] == (4, (0, 4), 2)
        # go-nvml's 1g holds 23552 of 184320 MiB, more than an eighth: go-nvlib's rule names it 1g.45gb, as
        # the double-memory 1g; the first by NVML's enum keeps the name, the other is left out and said.
        assert [p.name for p in gpu.mig_profiles].count("1g.45gb") == 1
        assert shapes["1g.45gb"] == (1, (0, 1, 2, 3, 4, 5, 6), 7)
        assert len(gpu.mig_profiles) == 6
    # Where each GPU sits, as a DGX's: its NUMA node from NVML's memory affinity (sysfs does not say), and
    # one NVLink domain, every GPU's links going to the same NVSwitches; no PCIe root without sysfs.
    assert [g.numa_node for g in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert {g.nvlink_domain for g in gpus} == {"nvswitch-0000:a0:00.0"}
    assert {g.pcie_root for g in gpus} == {None}
    assert not [c for c in node.calls() if c.startswith("stub:")], "discovery calls only what the library implements"


def test_mig_profile_ids_are_nvmls_not_the_enums(tmp_path: Path) -> None:
    """go-nvml's mocks give each profile its enum as id (1g = 0, 7g = 4): a caller passing the enum
    where NVML wants the id would make a 7g (id 0) for a 1g (enum 0). Here, as on hardware, it cannot."""
    with mock_node(tmp_path, "h100-80gb", count=1, mig=True):
        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            ids = {enum: pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, enum, version=1).id
                   for enum in (pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1,
                                pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2, pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE,
                                pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE, pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE,
                                pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE)}
            assert list(ids.values()) == [19, 20, 15, 14, 9, 5, 0]
            placement = pynvml.c_nvmlGpuInstancePlacement_t()
            placement.start, placement.size = 0, 1
            with pytest.raises(pynvml.NVMLError_InvalidArgument):  # the 1g's enum (0) as id is the 7g's
                pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE,
                                                                ctypes.byref(placement))
        finally:
            pynvml.nvmlShutdown()


@pytest.mark.parametrize("model", list(MODEL_NAMES))
def test_every_profile_is_made_at_every_placement_then_destroyed(model: str, tmp_path: Path) -> None:
    with mock_node(tmp_path, model, count=1, mig=True):
        backend = NvmlBackend(pynvml)
        [gpu] = backend.discover()
        uuids = set()
        for profile in gpu.mig_profiles:
            for start in profile.starts:
                made = backend.create_mig(gpu, profile, start)
                assert (made.profile, made.start, made.size, made.ci) == (profile.name, start, profile.size, 0)
                # NVML's GPU instance ids: the memory slices as a binary tree (a 7g is 0, a 1g at slice 0 is 7).
                assert made.gi == 8 // profile.size - 1 + start // profile.size
                assert MIG_UUID.match(made.uuid)
                assert made.uuid not in uuids, "each instance a UUID of its own"
                uuids.add(made.uuid)
                assert backend.mig_instances(gpu) == [made]
                backend.destroy_mig(gpu, made)
                assert backend.mig_instances(gpu) == []


def test_a_layout_fills_the_gpu_and_nothing_more_fits(tmp_path: Path) -> None:
    with mock_node(tmp_path, "h100-80gb", count=1, mig=True) as node:
        backend = NvmlBackend(pynvml)
        [gpu] = backend.discover()
        profiles = {p.name: p for p in gpu.mig_profiles}
        made = [backend.create_mig(gpu, profiles["3g.40gb"], 4), backend.create_mig(gpu, profiles["2g.20gb"], 0),
                backend.create_mig(gpu, profiles["1g.10gb+me"], 2), backend.create_mig(gpu, profiles["1g.10gb"], 3)]
        assert [(m.profile, m.gi) for m in backend.mig_instances(gpu)] == [
            ("2g.20gb", 3), ("1g.10gb+me", 9), ("1g.10gb", 10), ("3g.40gb", 2)]
        for profile, start in (("1g.10gb", 0), ("1g.10gb", 4), ("7g.80gb", 0), ("4g.40gb", 0)):
            with pytest.raises(GpuBackendError, match="Insufficient Resources"):
                backend.create_mig(gpu, profiles[profile], start)
        assert len(backend.mig_instances(gpu)) == 4, "a refused instance leaves nothing behind"
        state = node.state.read().gpus["0"]
        assert [(gi.id, gi.start, gi.size, [ci.uuid for ci in gi.compute_instances]) for gi in state.instances] == [
            (m.gi, m.start, m.size, [m.uuid]) for m in sorted(made, key=lambda m: m.gi)], "in the shared state file"


def test_the_one_media_engine_is_held_by_one_me_instance(tmp_path: Path) -> None:
    with mock_node(tmp_path, "a100-40gb", count=1, mig=True):
        backend = NvmlBackend(pynvml)
        [gpu] = backend.discover()
        me = gpu.mig_profile("1g.5gb+me")
        assert me is not None
        backend.create_mig(gpu, me, 0)
        with pytest.raises(GpuBackendError, match="Insufficient Resources"):
            backend.create_mig(gpu, me, 1)


def test_a_gpu_instance_with_a_compute_instance_is_in_use_and_a_stale_handle_is_refused(tmp_path: Path) -> None:
    with mock_node(tmp_path, "h100-80gb", count=1, mig=True):
        backend = NvmlBackend(pynvml)
        [gpu] = backend.discover()
        three = gpu.mig_profile("3g.40gb")
        assert three is not None
        made = backend.create_mig(gpu, three, 0)
        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            instance = pynvml.nvmlDeviceGetGpuInstanceById(handle, made.gi)
            with pytest.raises(pynvml.NVMLError_InUse):
                pynvml.nvmlGpuInstanceDestroy(instance)
            compute = pynvml.nvmlGpuInstanceGetComputeInstanceById(instance, made.ci)
            pynvml.nvmlComputeInstanceDestroy(compute)
            pynvml.nvmlGpuInstanceDestroy(instance)
            with pytest.raises(pynvml.NVMLError_InvalidArgument):
                pynvml.nvmlGpuInstanceGetInfo(instance)
            with pytest.raises(pynvml.NVMLError_NotFound):
                pynvml.nvmlDeviceGetGpuInstanceById(handle, made.gi)
            with pytest.raises(pynvml.NVMLError_NotFound):
                pynvml.nvmlDeviceGetHandleByUUID(made.uuid)
            with pytest.raises(pynvml.NVMLError_NotFound):
                pynvml.nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000")
        finally:
            pynvml.nvmlShutdown()


def test_ampere_mig_mode_waits_for_a_reset_and_hopper_switches_at_once(tmp_path: Path) -> None:
    with mock_node(tmp_path, ["a100-40gb", "h100-80gb"]) as node:
        pynvml.nvmlInit()
        try:
            ampere, hopper = pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlDeviceGetHandleByIndex(1)
            assert pynvml.nvmlDeviceSetMigMode(ampere, pynvml.NVML_DEVICE_MIG_ENABLE) == pynvml.NVML_ERROR_IN_USE
            assert pynvml.nvmlDeviceGetMigMode(ampere) == [0, 1], "pending until a GPU reset"
            assert pynvml.nvmlDeviceSetMigMode(hopper, pynvml.NVML_DEVICE_MIG_ENABLE) == pynvml.NVML_SUCCESS
            assert pynvml.nvmlDeviceGetMigMode(hopper) == [1, 1]
            with pytest.raises(pynvml.NVMLError_NotSupported):  # nothing is made on a GPU not in MIG mode
                pynvml.nvmlDeviceCreateGpuInstance(ampere, 19)
        finally:
            pynvml.nvmlShutdown()
        backend = NvmlBackend(pynvml)
        a100, h100 = backend.discover()
        with pytest.raises(GpuBackendError, match="switches MIG mode only at a GPU reset"):
            backend.set_mig_mode(a100, True)
        made = backend.create_mig(h100, h100.mig_profiles[0], 0)
        with pytest.raises(GpuBackendError, match="In use"):  # MIG mode off with an instance left
            backend.set_mig_mode(h100, False)
        backend.destroy_mig(h100, made)
        backend.set_mig_mode(h100, False)
        assert not backend.mig_enabled(h100)
    assert node.state.read().gpus["1"].mig_mode == 0


def test_processes_and_sm_shares_from_the_state_fake_gpu_writes(tmp_path: Path) -> None:
    with mock_node(tmp_path, "h100-80gb", count=2) as node:
        backend = NvmlBackend(pynvml)
        first, second = backend.discover()
        node.use(0, MockProcess(pid=101, memory=2 * GI, sm=0.6), MockProcess(pid=202, memory=3 * GI, mps=True, sm=0.1))
        found = {p.pid: (p.gpu, p.used, p.sm) for p in backend.processes(first)}
        assert found == {101: (first.uuid, 2 * GI, 0.6), 202: (first.uuid, 3 * GI, 0.1)}
        assert backend.processes(second) == []
        pynvml.nvmlInit()
        try:
            memory = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0))
            assert (memory.total, memory.used) == (81559 * 2**20, 5 * GI)
        finally:
            pynvml.nvmlShutdown()
        node.use(0)
        assert backend.processes(first) == []


def test_processes_of_a_gpu_in_mig_mode_come_from_its_mig_devices_once(tmp_path: Path) -> None:
    with mock_node(tmp_path, "a100-40gb", count=1, mig=True) as node:
        backend = NvmlBackend(pynvml)
        [gpu] = backend.discover()
        three = gpu.mig_profile("3g.20gb")
        assert three is not None
        one, two = backend.create_mig(gpu, three, 0), backend.create_mig(gpu, three, 4)
        node.use(0, MockProcess(pid=101, memory=2 * GI, mig_uuid=one.uuid),
                 MockProcess(pid=202, memory=3 * GI, mps=True, mig_uuid=two.uuid))
        assert {p.pid: p.used for p in backend.processes(gpu)} == {101: 2 * GI, 202: 3 * GI}
        with pytest.raises(GpuBackendError, match="In use"):  # a compute instance with a process on it
            backend.destroy_mig(gpu, one)


def test_a_lost_gpu_and_xid_and_ecc_events_reach_the_agent(tmp_path: Path) -> None:
    with mock_node(tmp_path, "h100-80gb", count=2) as node:
        backend = NvmlBackend(pynvml)
        first, second = backend.discover()
        assert backend.faults() == {}  # starts the event watch, in a thread
        for _ in range(200):  # an event set sees the events posted after it was made: wait for the watch's
            if "nvmlEventSetWait_v2" in node.calls():
                break
            time.sleep(0.05)
        node.post(1, XID_EVENT, 13)  # an application's own error
        node.post(1, XID_EVENT, 48)
        node.post(0, ECC_EVENT, 0)
        faults = {}
        for _ in range(100):
            faults.update(backend.faults())
            if len(faults) == 2:
                break
            time.sleep(0.05)
        assert {uuid: (f.kind, f.code) for uuid, f in faults.items()} == {
            second.uuid: ("xid", 48), first.uuid: ("ecc", None)}
        node.lose(1)
        assert {u: f.kind for u, f in backend.faults().items()} == {second.uuid: "lost"}
        with pytest.raises(GpuBackendError, match="GPU is lost"):
            backend.discover()


def test_another_process_sees_the_mig_instances_this_one_made(tmp_path: Path) -> None:
    """One GPU for the agent, nvidia-ctk and a container: the instances live in the state file."""
    with mock_node(tmp_path, "h100-80gb", count=1, mig=True):
        backend = NvmlBackend(pynvml)
        [gpu] = backend.discover()
        made = backend.create_mig(gpu, gpu.mig_profiles[0], 2)
        script = (
            "import json, pynvml\n"
            "from pathlib import Path\n"
            "from gpuslice.agent.gpus.nvml import NvmlBackend\n"
            f"backend = NvmlBackend(driver_root=Path({str(tmp_path)!r}))\n"
            "[gpu] = backend.discover()\n"
            "print(json.dumps([[m.profile, m.gi, m.uuid] for m in backend.mig_instances(gpu)]))\n")
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                              env={**__import__("os").environ, "GPUSLICE_MOCK_NVML_CONFIG": ""})
        assert json.loads(done.stdout.splitlines()[-1]) == [[made.profile, made.gi, made.uuid]]


def test_check_reads_the_mock_and_calls_no_entry_point_that_writes(tmp_path: Path) -> None:
    """At the C ABI: every entry point the read-only check reached (the library records them all)."""
    with mock_node(tmp_path / "root", "h100-80gb", count=2, mig=True) as node:
        backend = NvmlBackend(pynvml)
        [_, gpu] = backend.discover()
        backend.create_mig(gpu, gpu.mig_profiles[0], 0)
        before = len(node.calls())
        lines: list[str] = []
        run_check(pynvml, [tmp_path / "cdi"], lines.append, host_root=tmp_path, dev=tmp_path / "root/dev",
                  proc=tmp_path / "root/proc", sysfs=tmp_path / "sys")
        called = set(node.calls()[before:])
    text = "\n".join(lines)
    assert "product 'NVIDIA H100 80GB HBM3'" in text
    assert "memory 81559 MiB (catalog 81559 MiB: same)" in text
    allowed = {name for call in READ_CALLS for name in (call, f"{call}_v2", f"{call}_v3", f"{call}V")}
    assert called - allowed - {"nvmlInitWithFlags", "nvmlErrorString"} == set(), "only reads reached the library"
    assert not {c for c in called if c.startswith("stub:")}


@pytest.mark.parametrize(("model", "links", "switches"), [("a100-40gb", 12, 6), ("h100-80gb", 18, 4),
                                                          ("b200-180gb", 18, 2)])
def test_topology_answers_as_a_dgx(model: str, links: int, switches: int, tmp_path: Path) -> None:
    """NUMA nodes, PCIe paths and NVLinks, as a DGX of the model answers them (for topology attributes
    read from NVML): two sockets, GPUs in pairs behind a PCIe switch, every link active to an NVSwitch."""
    with mock_node(tmp_path, model, count=8):
        pynvml.nvmlInit()
        try:
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(8)]
            assert [pynvml.nvmlDeviceGetNumaNodeId(h) for h in handles] == [0, 0, 0, 0, 1, 1, 1, 1]
            for scope in (pynvml.NVML_AFFINITY_SCOPE_NODE, pynvml.NVML_AFFINITY_SCOPE_SOCKET):
                assert [list(pynvml.nvmlDeviceGetMemoryAffinity(h, 2, scope)) for h in handles] == \
                    [[1, 0]] * 4 + [[2, 0]] * 4, "one bit: the GPU's NUMA node (one per socket)"
            common = pynvml.nvmlDeviceGetTopologyCommonAncestor
            assert common(handles[0], handles[0]) == pynvml.NVML_TOPOLOGY_INTERNAL
            assert common(handles[0], handles[1]) == pynvml.NVML_TOPOLOGY_MULTIPLE
            assert common(handles[0], handles[2]) == pynvml.NVML_TOPOLOGY_NODE
            assert common(handles[0], handles[7]) == pynvml.NVML_TOPOLOGY_SYSTEM
            states = []
            for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
                try:
                    states.append(pynvml.nvmlDeviceGetNvLinkState(handles[3], link))
                except pynvml.NVMLError_InvalidArgument:
                    break
            assert states == [pynvml.NVML_FEATURE_ENABLED] * links
            remote = {pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handles[3], link).busId for link in range(links)}
            assert len(remote) == switches, "the links spread over the NVSwitches"
            assert all(re.match(r"^00000000:[0-9A-F]{2}:00\.0$", str(bus)) for bus in remote)
            assert pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(handles[3], 0) == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
        finally:
            pynvml.nvmlShutdown()
