"""Other managers of the same GPUs: another DRA driver's slices, the GPU Operator's MIG manager."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gpuslice.agent.gpus.fake import FakeBackend
from gpuslice.controller.status import Findings, conditions
from gpuslice.planning.node.coexistence import MIG_MANAGER_LABEL, other_driver_gpus, taken_gpus
from gpuslice.planning.node.node_pool import plan_node_pool
from gpuslice.planning.reads.usage import Usage
from gpuslice.planning.selection import Selection
from tests.builders import policy_model as policy

GPUS = FakeBackend("n", [("a100-40gb", 3)]).discover()


def nvidia_slice(devices: list[dict[str, Any]]) -> dict[str, Any]:
    """A slice as NVIDIA's gpu-kubelet-plugin publishes it: unqualified attributes in gpu.nvidia.com,
    the standard PCI ones qualified (its deviceinfo.go and mig.go)."""
    return {"driver": "gpu.nvidia.com", "nodeName": "n", "pool": {"name": "n"}, "devices": devices}


def gpu_device(uuid: str, bus_id: str) -> dict[str, Any]:
    return {"name": "gpu-0", "attributes": {"type": {"string": "gpu"}, "uuid": {"string": uuid},
                                            "productName": {"string": "NVIDIA A100-SXM4-40GB"},
                                            "resource.kubernetes.io/pciBusID": {"string": bus_id}}}


def test_nvidia_gpu_mig_and_vfio_devices_take_our_gpus() -> None:
    whole = nvidia_slice([gpu_device(GPUS[0].uuid, "0000:99:00.0")])
    mig = nvidia_slice([{"name": "gpu-1-mig-1g5gb-19-0", "attributes": {
        "type": {"string": "mig"}, "parentUUID": {"string": GPUS[1].uuid}, "uuid": {"string": "MIG-abc"},
        "profile": {"string": "1g.5gb"}}}])
    # VFIO: a uuid made from the PCI address, so only the bus id tells (as NVML's form, normalised).
    vfio = nvidia_slice([{"name": "gpu-vfio-2", "attributes": {
        "type": {"string": "vfio"}, "uuid": {"string": "5f2e8a"},
        "resource.kubernetes.io/pciBusID": {"string": GPUS[2].pci_bus_id.upper()}}}])
    taken = taken_gpus(GPUS, [other_driver_gpus(s) for s in (whole, mig, vfio)])
    assert taken == {GPUS[0].uuid: ("gpu.nvidia.com", "UUID"), GPUS[1].uuid: ("gpu.nvidia.com", "UUID"),
                     GPUS[2].uuid: ("gpu.nvidia.com", "PCI bus id")}
    assert [other_driver_gpus(s).gpu_devices for s in (whole, mig, vfio)] == [1, 1, 0]


def test_a_nic_drivers_devices_take_nothing() -> None:
    nic = {"driver": "sriov.example.com", "nodeName": "n", "devices": [{"name": "vf-0", "attributes": {
        "resource.kubernetes.io/pciBusID": {"string": "0000:3b:00.2"},
        "resource.kubernetes.io/pcieRoot": {"string": GPUS[0].pcie_root}}}]}
    assert taken_gpus(GPUS, [other_driver_gpus(nic)]) == {}
    assert other_driver_gpus(nic).gpu_devices == 0


def test_mig_policies_publish_nothing_where_the_mig_manager_runs() -> None:
    dynamic = policy("d", {"mode": "mig", "mig": {"profiles": ["1g.5gb"]}})
    layout = policy("l", {"mode": "mig", "mig": {"layout": {"3g.20gb": 2}}})
    memory = policy("m", {"mode": "memory", "sliceSize": "10Gi"})
    for mig in (dynamic, layout):
        plan = plan_node_pool({MIG_MANAGER_LABEL: "true"}, GPUS[:1], [mig])
        assert plan.devices == []
        assert "MIG manager is active" in plan.notes[0]
        assert plan_node_pool({MIG_MANAGER_LABEL: "false"}, GPUS[:1], [mig]).devices != []
    off = [replace(GPUS[0], mig_enabled=False)]  # as the MIG manager's all-disabled leaves it
    assert plan_node_pool({MIG_MANAGER_LABEL: "true"}, off, [memory]).devices != [], "only MIG fights it"


def test_the_policy_says_degraded_and_why() -> None:
    base = Findings((), Selection(()), 8, Usage())
    [*_, degraded] = conditions(Findings((), Selection(()), 8, Usage(),
                                         other_drivers=["n: gpu.nvidia.com (8 GPU devices)"]))
    assert (degraded.status, degraded.reason) == ("True", "GpusOfAnotherDriver")
    assert "n: gpu.nvidia.com (8 GPU devices)" in degraded.message
    [*_, degraded] = conditions(Findings((), Selection(()), 8, Usage(), mig_manager_nodes=["n"]))
    assert (degraded.reason, "nvidia.com/gpu.deploy.mig-manager=false" in degraded.message) == (
        "MigManagerActive", True)
    assert conditions(base)[-1].status == "False"
