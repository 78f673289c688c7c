"""Tests 3 and 4: the real resourceclaim controller and kube-scheduler allocate from a pool."""

from __future__ import annotations

from typing import Any

from gpuslice.devcluster.cluster import DevCluster
from gpuslice.kube.client import KubeClient
from tests.cluster.kubeutil import (
    RESOURCE,
    ClusterObjects,
    claim_template,
    counter_slice,
    device_class,
    device_slice,
    partition,
    pod_claim,
    pod_with_claim,
    wait_for,
)
from tests.cluster.observe import scheduler_settled

GI = 1024**3


async def _publish_pool(
    objects: ClusterObjects, unique: str, driver: str, node: str, devices: list[dict[str, Any]]
) -> None:
    await objects.create(f"{RESOURCE}/resourceslices", counter_slice(f"{unique}-0", driver, node, {"memory": "80Gi"}))
    await objects.create(f"{RESOURCE}/resourceslices", device_slice(f"{unique}-1", driver, node, devices))


def _allocated(claim: dict[str, Any] | None) -> list[dict[str, Any]]:
    if not claim:
        return []
    return list(claim.get("status", {}).get("allocation", {}).get("devices", {}).get("results", []))


async def test_claim_from_template_is_allocated_and_pod_bound(
    cluster: DevCluster, kube: KubeClient, cluster_objects: ClusterObjects, namespace: str, unique: str
) -> None:
    driver, node = f"{unique}.alloc.test.gpuslice.dev", cluster.node_names[-1]
    await _publish_pool(cluster_objects, unique, driver, node, [partition(f"gpu-0-10g-{i}", "10Gi") for i in range(8)])
    await cluster_objects.create(f"{RESOURCE}/deviceclasses", device_class(f"{unique}.test", driver))
    await kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates", claim_template("slice", f"{unique}.test"))
    await kube.create(f"/api/v1/namespaces/{namespace}/pods", pod_with_claim("tenant", "slice"))

    async def allocated_claim() -> dict[str, Any] | None:
        claim = await pod_claim(kube, namespace, "tenant")
        return claim if _allocated(claim) else None

    claim = await wait_for(allocated_claim, within=60, what="the pod's claim to be allocated")
    owner = claim["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("Pod", "tenant"), "the resourceclaim controller made the claim"
    [result] = _allocated(claim)
    assert (result["driver"], result["pool"]) == (driver, node)
    assert result["device"].startswith("gpu-0-10g-")
    assert [r["name"] for r in claim["status"]["reservedFor"]] == ["tenant"]

    async def bound_node() -> str | None:
        pod = await kube.get(f"/api/v1/namespaces/{namespace}/pods/tenant")
        return pod["spec"].get("nodeName")

    assert await wait_for(bound_node, within=30, what="the pod to be bound") == node


async def test_scheduler_enforces_shared_counters(
    cluster: DevCluster, kube: KubeClient, cluster_objects: ClusterObjects, namespace: str, unique: str
) -> None:
    """Two 50Gi partitions of one 80Gi GPU: only one can ever be allocated."""
    driver, node = f"{unique}.counters.test.gpuslice.dev", cluster.node_names[0]
    await _publish_pool(cluster_objects, unique, driver, node, [partition(f"gpu-0-50g-{i}", "50Gi") for i in range(2)])
    await cluster_objects.create(f"{RESOURCE}/deviceclasses", device_class(f"{unique}.test", driver))
    await kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates", claim_template("half", f"{unique}.test"))
    pods = ["tenant-a", "tenant-b"]
    for pod in pods:
        await kube.create(f"/api/v1/namespaces/{namespace}/pods", pod_with_claim(pod, "half"))

    async def states() -> dict[str, tuple[str | None, list[dict[str, Any]]]]:
        result = {}
        for pod in pods:
            body = await kube.get(f"/api/v1/namespaces/{namespace}/pods/{pod}")
            result[pod] = (body["spec"].get("nodeName"), _allocated(await pod_claim(kube, namespace, pod)))
        return result

    async def one_bound_other_unschedulable() -> bool:
        bound = [p for p, (node_name, _) in (await states()).items() if node_name]
        unschedulable = []
        for pod in pods:
            body = await kube.get(f"/api/v1/namespaces/{namespace}/pods/{pod}")
            conditions = body.get("status", {}).get("conditions", [])
            if any(c["type"] == "PodScheduled" and c["status"] == "False" for c in conditions):
                unschedulable.append(pod)
        return len(bound) == 1 and len(unschedulable) == 1

    await wait_for(one_bound_other_unschedulable, within=60, what="one pod bound and one unschedulable")
    await scheduler_settled(cluster)  # the loser was tried again since, and must stay pending
    final = await states()
    assert sum(1 for node_name, _ in final.values() if node_name) == 1
    allocated = [r for _, results in final.values() for r in results]
    assert len(allocated) == 1, f"exactly one 50Gi partition of the 80Gi GPU may be allocated: {allocated}"
    assert allocated[0]["pool"] == node
