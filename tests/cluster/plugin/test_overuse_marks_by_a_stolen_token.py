"""What a node's stolen agent token can do to a claim's status
beyond the marks `test_usage.py` tries. It may write status.devices of its own node's claims, and
nothing else of a claim's status: not an allocation (of a pending claim, to pull it onto its node),
not reservedFor (to make a pod of its choice one the controller would act on), and a mark on a
device the claim does not hold gets nobody evicted. Real API server, scheduler, kubelet plugin and
controller."""

from __future__ import annotations

from typing import Any

import pytest

from gpuslice.kube.client import KubeClient, KubeError
from tests.cluster.kubeutil import RESOURCE, pod_claim, wait_for
from tests.cluster.observe import controller_metrics, total
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory
from tests.cluster.plugin.gpu_use import FAST, pod_uid
from tests.cluster.plugin.plugin_nodes import PluginNodeFactory, one_gpu_with_pods, pod_events


def status_of(claim: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    meta = claim["metadata"]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"]}, "status": status}


def forged(driver: str, pool: str, device: str, pods: list[tuple[str, str]]) -> dict[str, Any]:
    return {"driver": driver, "pool": pool, "device": device,
            "conditions": [{"type": "GpuMemoryOveruse", "status": "True", "reason": "OverAllocation",
                            "message": "forged", "lastTransitionTime": "2026-12-01T10:00:00Z"}],
            "data": {"overusingPods": [{"uid": uid, "name": name, "since": "2026-12-01T10:00:00Z",
                                        "message": f"forged mark naming {name}"} for uid, name in pods]}}


async def test_a_stolen_agent_token_writes_no_allocation_or_reservation_and_marks_only_held_devices(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, plugin_node: PluginNodeFactory,
    namespace: str,
) -> None:
    node, policy = await one_gpu_with_pods(kube, make_policy, plugin_node, namespace,
                                           {"mode": "memory", "sliceSize": "10G"}, 8, ["mine", "bystander"], FAST)
    await kube.merge_patch(f"/apis/gpuslice.dev/v1alpha1/gpuslicepolicies/{policy}", {"spec": {"onOveruse": "Evict"}})
    claim = await pod_claim(kube, namespace, "mine")
    other = await pod_claim(kube, namespace, "bystander")
    assert claim is not None
    assert other is not None
    path = f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{claim['metadata']['name']}/status"
    [held] = claim["status"]["allocation"]["devices"]["results"]
    [theirs] = other["status"]["allocation"]["devices"]["results"]
    bystander = await pod_uid(kube, namespace, "bystander")
    # A pending claim: made, never allocated (no pod asks for it).
    pending = await kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaims", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "pending"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": f"{policy}.gpuslice.dev"}}]}}})
    async with await KubeClient.from_kubeconfig(node.agent_kubeconfig) as as_agent:
        # An allocation of its own choosing (the very device the bystander holds, on its own node).
        allocation = {**claim["status"]["allocation"], "devices": {"results": [{**theirs, "request": "gpu"}]}}
        with pytest.raises(KubeError, match="resourceclaims/binding") as refused:
            await as_agent.apply(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/pending/status",
                                 status_of(pending, {"allocation": allocation}), field_manager="rogue")
        print("allocation refused:", refused.value.message[:300])
        # The bystander added to reservedFor of the claim it marks, so that the mark names a reserved pod.
        reserved = [*claim["status"]["reservedFor"], {"resource": "pods", "name": "bystander", "uid": bystander}]
        with pytest.raises(KubeError, match="resourceclaims/binding") as refused:
            await as_agent.apply(path, status_of(claim, {"reservedFor": reserved}), field_manager="rogue")
        print("reservedFor refused:", refused.value.message[:300])
        # A mark on a device of its pool the claim does not hold (the bystander's), naming the bystander.
        before = total(await controller_metrics(controller), "gpuslice_overuse_actions_total", action="evicted")
        try:
            await as_agent.apply(path, status_of(claim, {"devices": [
                forged(theirs["driver"], theirs["pool"], theirs["device"], [(bystander, "bystander")])]}),
                field_manager="rogue")
            print("the API server took a mark on a device the claim does not hold")
        except KubeError as error:
            print("mark on a device not held refused:", error.message[:300])
    # The controller read the claim again (its own mark of the same claim, naming the claim's own pod,
    # is the control: that one is acted on) and evicted nobody for the forged one.
    mine = await pod_uid(kube, namespace, "mine")
    async with await KubeClient.from_kubeconfig(node.agent_kubeconfig) as as_agent:
        await as_agent.apply(path, status_of(claim, {"devices": [
            forged(held["driver"], held["pool"], held["device"], [(mine, "mine")])]}), field_manager="control")

    async def mine_gone() -> bool:
        try:
            body = await kube.get(f"/api/v1/namespaces/{namespace}/pods/mine")
        except KubeError as error:
            return error.status == 404
        return bool(body["metadata"].get("deletionTimestamp"))

    await wait_for(mine_gone, within=60, what="the control: the claim's own pod, marked, evicted")
    after = total(await controller_metrics(controller), "gpuslice_overuse_actions_total", action="evicted")
    assert after == before + 1, f"evictions {before} -> {after}: only the control's"
    body = await kube.get(f"/api/v1/namespaces/{namespace}/pods/bystander")
    assert "deletionTimestamp" not in body["metadata"], "the bystander was evicted by a mark on a device it holds"
    assert not [e for e in await pod_events(kube, namespace, "bystander") if e["reason"].startswith("GpuMemory")]
