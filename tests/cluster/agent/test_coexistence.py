"""Another DRA driver on the same node (NVIDIA's gpu.nvidia.com runs wherever nvidia.com/gpu.present
is, as gpuslice's agent does): the agent stops publishing a GPU that driver publishes, keeps what a
claim holds until it is released, says so, and publishes the GPU again once the other driver is gone."""

from __future__ import annotations

from typing import Any

from gpuslice.agent.gpus.fake import FakeBackend
from gpuslice.devcluster.cluster import DevCluster
from gpuslice.kube.client import KubeClient
from tests.cluster.gpu_nodes import GpuNodeFactory
from tests.cluster.kubeutil import condition, wait_for
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory
from tests.cluster.pools import SLICES, create_pods, pool_devices, published, settle, tenant_policy

EVENTS = "/api/v1/namespaces/default/events"


def nvidia_slice(node: str, uuid: str) -> dict[str, Any]:
    """A slice as NVIDIA's gpu-kubelet-plugin publishes one GPU (its deviceinfo.go): the pool is the
    node, the attributes unqualified in its domain, the PCI bus id another than gpuslice's view."""
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-gpu.nvidia.com-x7k2p"},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": node, "pool": {"name": node, "generation": 1,
                                                                         "resourceSliceCount": 1},
                 "devices": [{"name": "gpu-0", "attributes": {
                     "type": {"string": "gpu"}, "uuid": {"string": uuid},
                     "productName": {"string": "NVIDIA H100 80GB HBM3"}, "brand": {"string": "Nvidia"},
                     "architecture": {"string": "Hopper"}, "cudaComputeCapability": {"version": "9.0.0"},
                     "driverVersion": {"version": "580.95.5"}, "cudaDriverVersion": {"version": "13.0.0"},
                     "resource.kubernetes.io/pciBusID": {"string": "0000:99:00.0"}},
                     "capacity": {"memory": {"value": "81559Mi"}}}]},
    }


async def reasons(kube: KubeClient, node: str) -> list[str]:
    events = await kube.list(EVENTS, fieldSelector=f"involvedObject.name={node}")
    return [f"{e['reason']}: {e['message']}" for e in events]


def on_gpu(devices: dict[str, dict[str, Any]], uuid: str) -> set[str]:
    return {n for n, d in devices.items() if d["attributes"]["gpuslice.dev/parentUUID"]["string"] == uuid}


async def test_a_gpu_another_driver_publishes_is_not_published_and_comes_back_when_it_goes(
    cluster: DevCluster, kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
    gpu_node: GpuNodeFactory, namespace: str,
) -> None:
    node = await gpu_node("h100-80gb", 2)
    gpus = FakeBackend(node.name, [("h100-80gb", 2)]).discover()
    name = await tenant_policy(make_policy, namespace, node.name, {"mode": "memory", "sliceSize": "10G"})
    before = await published(kube, node.name, 16)
    await create_pods(kube, namespace, "gpu-slice", ["held"])
    [result] = await settle(cluster, kube, namespace, ["held"], 1)
    held = result["device"]
    taken = next(g for g in gpus if held in on_gpu(before, g.uuid))  # the other driver takes the held one's GPU
    free = next(g for g in gpus if g is not taken)

    await kube.create(SLICES, nvidia_slice(node.name, taken.uuid))

    async def left_out() -> dict[str, dict[str, Any]] | None:
        devices = await pool_devices(kube, node.name)
        return devices if set(devices) == on_gpu(before, free.uuid) | {held} else None

    during = await wait_for(left_out, within=60, what=f"GPU {taken.uuid} left out but for the claimed device")
    assert during[held]["consumesCounters"] == before[held]["consumesCounters"], "an allocated device never changes"
    assert [t["key"] for t in during[held].get("taints") or []] == ["gpuslice.dev/pending-change"]

    said = await wait_for(lambda: _with(kube, node.name, "GpuPublishedByAnotherDriver"), within=30,
                          what="a Node Event naming the GPU")
    assert taken.uuid in said
    assert "gpu.nvidia.com" in said
    assert "same UUID" in said
    metrics = await node.metrics()
    assert metrics[f'gpuslice_agent_gpus_of_another_driver{{driver="gpu.nvidia.com",gpu="{taken.uuid}",'
                   f'node="{node.name}"}}'] == 1.0

    async def degraded() -> dict[str, Any] | None:
        found = condition(await kube.get(f"/apis/gpuslice.dev/v1alpha1/gpuslicepolicies/{name}"), "Degraded")
        return found if found.get("reason") == "GpusOfAnotherDriver" else None

    reported = await wait_for(degraded, within=60, what="the policy to say another driver publishes GPUs")
    assert f"{node.name}: gpu.nvidia.com (1 GPU devices)" in reported["message"]

    # Released: its device goes too. The other driver gone: the GPU comes back.
    await kube.delete(f"/api/v1/namespaces/{namespace}/pods/held", gracePeriodSeconds=0)
    await wait_for(lambda: _only(kube, node.name, on_gpu(before, free.uuid)), within=60,
                   what="the released device of the other driver's GPU to go")
    await kube.delete(f"{SLICES}/{node.name}-gpu.nvidia.com-x7k2p")
    await wait_for(lambda: _only(kube, node.name, set(before)), within=60, what="the GPU published again")
    assert await wait_for(lambda: _with(kube, node.name, "GpuFreeOfAnotherDriver"), within=30, what="a Normal Event")


async def _with(kube: KubeClient, node: str, reason: str) -> str | None:
    return next((r for r in await reasons(kube, node) if r.startswith(f"{reason}: ")), None)


async def _only(kube: KubeClient, node: str, names: set[str]) -> bool:
    return set(await pool_devices(kube, node)) == names


async def test_a_device_plugin_seen_in_the_nodes_allocatable_takes_every_gpu_until_it_goes(
    cluster: DevCluster, kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
    gpu_node: GpuNodeFactory, namespace: str,
) -> None:
    """NVIDIA's device plugin (or HAMi) advertises nvidia.com/gpu in the Node's allocatable, with no label of the
    GPU Operator's: the agent publishes nothing more on the node, says so on the Node and in the policy's
    condition, and publishes again once the plugin's resources are gone (here set as a kubelet would, by a
    patch of the Node's status)."""
    node = await gpu_node("h100-80gb", 2)
    name = await tenant_policy(make_policy, namespace, node.name, {"mode": "memory", "sliceSize": "10G"})
    before = await published(kube, node.name, 16)
    status = f"/api/v1/nodes/{node.name}/status"
    await kube.merge_patch(status, {"status": {"capacity": {"nvidia.com/gpu": "2"},
                                               "allocatable": {"nvidia.com/gpu": "2"}}})
    await wait_for(lambda: _only(kube, node.name, set()), within=60, what="every device of the node to go")
    said = await wait_for(lambda: _with(kube, node.name, "GpuAdvertisedByDevicePlugin"), within=30,
                          what="a Node Event naming the device plugin's resources")
    assert "nvidia.com/gpu: 2" in said
    assert "nvidia.com/gpu.deploy.device-plugin=false" in said
    metrics = await node.metrics()
    assert sum(v for k, v in metrics.items()
               if k.startswith("gpuslice_agent_gpus_of_another_driver{") and 'driver="device-plugin"' in k) == 2

    async def degraded() -> dict[str, Any] | None:
        found = condition(await kube.get(f"/apis/gpuslice.dev/v1alpha1/gpuslicepolicies/{name}"), "Degraded")
        return found if found.get("reason") == "DevicePlugin" else None

    reported = await wait_for(degraded, within=60, what="the policy to say a device plugin holds the node's GPUs")
    assert f"node {node.name} GPU 0 (NVIDIA H100 80GB HBM3)" in reported["message"]

    await kube.merge_patch(status, {"status": {"capacity": {"nvidia.com/gpu": None},
                                               "allocatable": {"nvidia.com/gpu": None}}})
    await wait_for(lambda: _only(kube, node.name, set(before)), within=60, what="the GPUs published again")
    assert await wait_for(lambda: _with(kube, node.name, "GpuFreeOfAnotherDriver"), within=30, what="a Normal Event")
