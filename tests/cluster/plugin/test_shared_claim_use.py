"""Pods that share one claim are judged together against what it was allocated, once: the scheduler
and the maxMemory webhook count a shared claim once, so its pods together may use what it holds and
no more. Tried as a tenant would stretch it: several pods each within the claim but over it together
(with MPS too, where each client's pinned limit is the whole claim's), and a pod that joins late.
With onOveruse: Evict the largest users go until the rest fit, and the others stay."""

from __future__ import annotations

import re

import pytest

from gpuslice.kube.client import KubeClient
from tests.cluster.kubeutil import RESOURCE, wait_for
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory
from tests.cluster.plugin.gpu_use import FAST, claim_mark, metric_is, pod_sharing, pod_uid, shared_claim, use
from tests.cluster.plugin.plugin_nodes import PluginNodeFactory, event_with, gone, one_gpu_with_pods, pod_phase, running

GI = 1024**3
MIB = 1024**2


@pytest.mark.parametrize("isolation", ["None", "MPS"])
async def test_three_pods_on_one_10g_claim_using_27gi_are_caught(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, plugin_node: PluginNodeFactory,
    namespace: str, isolation: str,
) -> None:
    node, policy = await one_gpu_with_pods(kube, make_policy, plugin_node, namespace,
                                           {"mode": "memory", "sliceSize": "10G", "isolation": isolation}, 8, [],
                                           FAST)
    await kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaims", shared_claim("shared", f"{policy}.gpuslice.dev"))
    pods = ["s0", "s1", "s2"]
    for pod in pods:
        await kube.create(f"/api/v1/namespaces/{namespace}/pods", pod_sharing(pod, "shared"))
    await running(kube, namespace, pods)
    if isolation == "MPS":  # each client may allocate the whole claim: the limit is the claim's, per process
        assert {node.env(namespace, p)["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] for p in pods} == {f"0={10**10 // MIB}M"}
    for i, pod in enumerate(pods):
        await use(node, kube, namespace, pod, 5201 + i, "9Gi")
    labels = {"node": node.name, "policy": policy, "namespace": namespace}
    await metric_is(node, "gpuslice_tenant_used_bytes", labels, 27 * GI)
    allocated = {p: await node.metric("gpuslice_pod_gpu_memory_allocated_bytes",
                                      {"namespace": namespace, "pod": p, "policy": policy, "container": "c"})
                 for p in pods}
    entry = await wait_for(lambda: claim_mark(kube, namespace, "shared"), within=30, what="the claim's overuse mark")
    print("tenant used 27Gi; allocated per pod (agent metric):", allocated, "; claim's overuse mark:", entry)
    marked = any(c.get("status") == "True" for c in entry["conditions"])
    assert marked, f"3 pods sharing one 10G claim use 27Gi of the GPU and no overuse is marked (allocated per pod {allocated})"
    assert sorted(p["uid"] for p in entry["data"]["overusingPods"]) == sorted(
        [await pod_uid(kube, namespace, p) for p in pods]), "the mark names each pod of the claim"
    assert sum(v or 0 for v in allocated.values()) == 10**10, "each pod's share: the claim counted once"
    for pod in pods:
        await metric_is(node, "gpuslice_pod_gpu_overuse", {"namespace": namespace, "pod": pod}, 1)
        event = await event_with(kube, namespace, pod, "with the 2 other pods sharing its claims")
        assert event["reason"] == "GpuMemoryOveruse"
        # What the pods used when the agent marked the claim: 18Gi once two pods were over it, or 27Gi.
        assert re.search(rf"\({namespace}/shared\) that is (18|27)Gi", event["message"]), event["message"]
        assert await pod_phase(kube, namespace, pod) == "Running", "onOveruse: Report reports only"


async def test_evict_takes_the_largest_users_of_a_shared_claim_until_the_rest_fit(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, plugin_node: PluginNodeFactory,
    namespace: str,
) -> None:
    """Two pods within their 10G claim together; a third joins late and takes the three over. The
    largest user goes, not the latecomer, and not all three: the fewest evictions that end it."""
    node, policy = await one_gpu_with_pods(kube, make_policy, plugin_node, namespace,
                                           {"mode": "memory", "sliceSize": "10G"}, 8, [], FAST)
    await kube.merge_patch(f"/apis/gpuslice.dev/v1alpha1/gpuslicepolicies/{policy}", {"spec": {"onOveruse": "Evict"}})
    await kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaims", shared_claim("shared", f"{policy}.gpuslice.dev"))
    for pod in ("s0", "s1"):
        await kube.create(f"/api/v1/namespaces/{namespace}/pods", pod_sharing(pod, "shared"))
    await running(kube, namespace, ["s0", "s1"])
    await use(node, kube, namespace, "s0", 5301, "4Gi")
    await use(node, kube, namespace, "s1", 5302, "4608Mi")
    labels = {"node": node.name, "policy": policy, "namespace": namespace}
    await metric_is(node, "gpuslice_tenant_used_bytes", labels, 8.5 * GI)
    for pod in ("s0", "s1"):  # 8.5Gi of 9.3Gi: within, past the grace
        await metric_is(node, "gpuslice_pod_gpu_memory_used_bytes", {"namespace": namespace, "pod": pod},
                        {"s0": 4 * GI, "s1": 4.5 * GI}[pod])
    assert await claim_mark(kube, namespace, "shared") is None

    await kube.create(f"/api/v1/namespaces/{namespace}/pods", pod_sharing("s2", "shared"))
    await running(kube, namespace, ["s2"])
    await use(node, kube, namespace, "s2", 5303, "3Gi")
    await gone(kube, namespace, ["s1"], within=60)
    evicted = await event_with(kube, namespace, "s1", "was evicted")
    assert evicted["reason"] == "GpuMemoryOveruseEvicted"
    for pod in ("s0", "s2"):
        told = await event_with(kube, namespace, pod, "not this pod, as things stand")
        assert told["reason"] == "GpuMemoryOveruse"
        ended = await event_with(kube, namespace, pod, "back within")
        assert (ended["reason"], ended["type"]) == ("GpuMemoryOveruseEnded", "Normal")
        assert await pod_phase(kube, namespace, pod) == "Running", "only the largest user goes"
    entry = await claim_mark(kube, namespace, "shared")
    assert entry is not None
    assert entry["conditions"][0]["status"] == "False"
