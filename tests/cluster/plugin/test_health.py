"""GPU health: a fault taints the GPU's devices (the real scheduler stops allocating them), a lost GPU's
pods are evicted by the device-taint-eviction controller, the kubelet's health cache puts the device's
health into the pod's status, and the taint lifts itself once the GPU has been quiet for the recovery
time (shortened here by a flag)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpuslice.devcluster.cluster import DevCluster
from gpuslice.kube.client import KubeClient
from tests.cluster.kubeutil import pod_claim, wait_for
from tests.cluster.observe import scheduler_settled
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory
from tests.cluster.plugin.plugin_nodes import PluginNode, PluginNodeFactory, gone, pod_phase, running
from tests.cluster.pools import create_pods, pool_devices, pool_versions, published, tenant_policy

GPU_BACKENDS = ("fake", "nvml")  # each test on the fake backend and on the mock NVML library

QUICK_HEALTH = ["--health-interval=0.5", "--health-recovery=3"]


async def gpu_of(kube: KubeClient, node: PluginNode, namespace: str, pod: str) -> tuple[str, int]:
    """The UUID and index of the GPU the pod's device is on."""
    claim = await pod_claim(kube, namespace, pod)
    assert claim is not None
    device = (await pool_devices(kube, node.name))[claim["status"]["allocation"]["devices"]["results"][0]["device"]]
    return device["attributes"]["gpuslice.dev/parentUUID"]["string"], device["attributes"]["gpuslice.dev/index"]["int"]


def taints_by_gpu(devices: dict[str, dict[str, Any]]) -> dict[str, set[tuple[str, str, str]]]:
    found: dict[str, set[tuple[str, str, str]]] = {}
    for device in devices.values():
        gpu = device["attributes"]["gpuslice.dev/parentUUID"]["string"]
        found.setdefault(gpu, set()).update((t["key"], t.get("value", ""), t["effect"]) for t in device.get("taints") or [])
    return found


async def resource_health(kube: KubeClient, namespace: str, pod: str) -> list[dict[str, Any]]:
    body = await kube.get(f"/api/v1/namespaces/{namespace}/pods/{pod}")
    statuses = (body.get("status") or {}).get("containerStatuses") or [{}]
    return [r for s in statuses[0].get("allocatedResourcesStatus") or [] for r in s.get("resources") or []]


async def node_events(kube: KubeClient, node: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in await kube.list("/api/v1/namespaces/default/events")
            if e["involvedObject"]["name"] == node and e["reason"] == reason]


# The fake backend's fault stays until `clear`; NVML's XID is an event, seen once, after which the taint
# lifts once the GPU is quiet for the recovery time (test_an_xid_event_taints_until_the_gpu_is_quiet).
@pytest.mark.gpu_backends("fake")
async def test_unhealthy_gpu_is_tainted_shown_in_the_pod_status_and_recovers(
    cluster: DevCluster, kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
    plugin_node: PluginNodeFactory, namespace: str,
) -> None:
    node = await plugin_node("h100-80gb", 2, agent_args=QUICK_HEALTH)
    policy = await tenant_policy(make_policy, namespace, node.name, {"mode": "memory", "sliceSize": "40G"})
    await published(kube, node.name, 4)  # two 40G slices per GPU
    await create_pods(kube, namespace, "gpu-slice", ["a"])
    await running(kube, namespace, ["a"])
    sick, index = await gpu_of(kube, node, namespace, "a")

    async def healthy_shown() -> bool:
        return [r["health"] for r in await resource_health(kube, namespace, "a")] == ["Healthy"]

    await wait_for(healthy_shown, within=30, what="the pod's status to show its device Healthy")

    node.fake_gpu("fault", str(index), "--xid", "48", "--message", "double-bit ECC in the framebuffer")

    async def tainted() -> bool:
        taints = taints_by_gpu(await pool_devices(kube, node.name))
        return taints.get(sick) == {("gpuslice.dev/unhealthy", "XID-48", "NoSchedule")} and all(
            not found for gpu, found in taints.items() if gpu != sick)

    await wait_for(tainted, within=30, what="the faulty GPU's devices (only) to be tainted NoSchedule")
    # A taint is a status of the device, not a change of it: the allocated device is not held back (no
    # pending-change), the free one does not drain, and the pool settles (nothing more is written).
    versions = await pool_versions(kube, node.name)
    await asyncio.sleep(6)  # length: across the health recovery's 3 s, a rewrite comes from a clock, not an event
    assert await pool_versions(kube, node.name) == versions, "the taint made the agent rewrite the pool again"
    assert await tainted()

    async def unhealthy_shown() -> list[dict[str, Any]] | None:
        found = await resource_health(kube, namespace, "a")
        return found if [r["health"] for r in found] == ["Unhealthy"] else None

    [shown] = await wait_for(unhealthy_shown, within=60, what="the pod's status to show its device Unhealthy")
    assert shown["resourceID"].startswith("gpuslice.dev/gpu=")
    assert "XID 48" in shown.get("message", "")
    assert await pod_phase(kube, namespace, "a") == "Running", "NoSchedule: the running pod keeps its device"
    [event] = await wait_for(lambda: node_events(kube, node.name, "GpuUnhealthy"), what="the GpuUnhealthy Event")
    assert event["type"] == "Warning"
    assert f"GPU {index} ({sick}, NVIDIA H100 80GB HBM3) is unhealthy: XID 48 error" in event["message"]
    policy_body = await kube.get(f"/apis/gpuslice.dev/v1alpha1/gpuslicepolicies/{policy}")

    async def degraded() -> bool:
        body = await kube.get(f"/apis/gpuslice.dev/v1alpha1/gpuslicepolicies/{policy}")
        return any(c["type"] == "Degraded" and c["reason"] == "GpuUnhealthy" and c["message"].startswith("2 devices")
                   for c in (body.get("status") or {}).get("conditions") or [])

    assert policy_body["metadata"]["name"] == policy
    await wait_for(degraded, within=60, what="the policy's status to say 2 devices are on an unhealthy GPU")
    samples = await node.metrics()
    assert any(f'gpu="{sick}"' in k and 'reason="XID-48"' in k and v == 1 for k, v in samples.items())

    # The sick GPU has one free slice left, the healthy one two: three pods, two run.
    await create_pods(kube, namespace, "gpu-slice", ["b", "c", "d"])

    async def runs() -> list[str]:
        return [p for p in "bcd" if await pod_phase(kube, namespace, p) == "Running"]

    async def two_run() -> list[str] | None:
        found = await runs()
        return found if len(found) == 2 else None

    ran = await wait_for(two_run, within=60, what="two of the three pods to run on the healthy GPU")
    for pod in ran:
        assert (await gpu_of(kube, node, namespace, pod))[0] != sick, "nothing new lands on the unhealthy GPU"
    await scheduler_settled(cluster)  # the third was tried again since; it must not get the tainted slice
    assert await runs() == ran

    node.fake_gpu("clear", str(index))

    async def lifted() -> bool:
        return not any(taints_by_gpu(await pool_devices(kube, node.name)).values())

    await wait_for(lifted, within=30, what="the taint to lift once the GPU is quiet for the recovery time")
    await running(kube, namespace, ["b", "c", "d"], within=60)
    await wait_for(healthy_shown, within=60, what="the pod's status to show its device Healthy again")
    await wait_for(lambda: node_events(kube, node.name, "GpuHealthy"), what="the GpuHealthy Event")
    for pod in "abcd":
        await kube.delete(f"/api/v1/namespaces/{namespace}/pods/{pod}")
    await gone(kube, namespace, list("abcd"))


async def test_lost_gpu_evicts_its_pods_and_allocation_resumes_when_it_is_back(
    cluster: DevCluster, kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
    plugin_node: PluginNodeFactory, namespace: str,
) -> None:
    node = await plugin_node("h100-80gb", 1, agent_args=QUICK_HEALTH)
    await tenant_policy(make_policy, namespace, node.name, {"mode": "memory", "sliceSize": "40G"})
    await published(kube, node.name, 2)
    await create_pods(kube, namespace, "gpu-slice", ["victim"])
    await running(kube, namespace, ["victim"])

    node.fake_gpu("fault", "0", "--lost")

    async def no_execute() -> bool:
        devices = await pool_devices(kube, node.name)
        return len(devices) == 2 and all([(t["key"], t["value"], t["effect"]) for t in d.get("taints") or []] == [
            ("gpuslice.dev/unhealthy", "GPU-lost", "NoExecute")] for d in devices.values())

    await wait_for(no_execute, within=30, what="the lost GPU's devices to be tainted NoExecute")
    await gone(kube, namespace, ["victim"], within=90)  # evicted, unprepared by the kubelet, removed
    assert node.cdi_specs() == []
    [event] = await wait_for(lambda: node_events(kube, node.name, "GpuLost"), what="the GpuLost Event")
    assert "pods using them are evicted" in event["message"]

    await create_pods(kube, namespace, "gpu-slice", ["next"])
    await scheduler_settled(cluster)  # "next" was tried, and parked
    assert await pod_phase(kube, namespace, "next") == "Pending", "nothing is allocated on a lost GPU"
    node.fake_gpu("clear", "0")
    await running(kube, namespace, ["next"], within=60)
    await kube.delete(f"/api/v1/namespaces/{namespace}/pods/next")
    await gone(kube, namespace, ["next"])


@pytest.mark.gpu_backends("nvml")
async def test_an_xid_event_taints_until_the_gpu_is_quiet(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, plugin_node: PluginNodeFactory,
    namespace: str,
) -> None:
    """NVML's XID events, through the mock library's event set into the agent's own NVML event watch:
    an application's error (XID 13) is no fault of the GPU; XID 48 taints the GPU's devices, and with no
    event after it the taint lifts once the recovery time has passed (nothing to clear: NVML's events
    are seen once)."""
    node = await plugin_node("h100-80gb", 2, agent_args=["--health-interval=0.5", "--health-recovery=8"])
    await tenant_policy(make_policy, namespace, node.name, {"mode": "memory", "sliceSize": "40G"})
    await published(kube, node.name, 4)
    gpus = {d["attributes"]["gpuslice.dev/index"]["int"]: d["attributes"]["gpuslice.dev/parentUUID"]["string"]
            for d in (await pool_devices(kube, node.name)).values()}
    # GPU 0's XID 13 comes first: the agent's one event set delivers events in order, and a health check
    # takes every fault seen so far, so had XID 13 been taken for a fault, GPU 0 would be tainted no later
    # than GPU 1 (and for the recovery time after): GPU 1 tainted alone shows it was seen and ignored.
    node.fake_gpu("fault", "0", "--xid", "13")
    node.fake_gpu("fault", "1", "--xid", "48")

    async def tainted() -> bool:
        taints = taints_by_gpu(await pool_devices(kube, node.name))
        assert not taints.get(gpus[0]), "XID 13 is the application's, no fault of GPU 0"
        return taints.get(gpus[1]) == {("gpuslice.dev/unhealthy", "XID-48", "NoSchedule")}

    await wait_for(tainted, within=30, what="GPU 1's devices (only) to be tainted after its XID 48 event")

    async def lifted() -> bool:
        return not any(taints_by_gpu(await pool_devices(kube, node.name)).values())

    await wait_for(lifted, within=40, what="the taint to lift with no event for the recovery time")
    [event] = await wait_for(lambda: node_events(kube, node.name, "GpuUnhealthy"), what="the GpuUnhealthy Event")
    assert "XID 48" in event["message"]
