"""Test 1: the apiserver serves the DRA API gpuslice builds on, where we expect it."""

from __future__ import annotations

from gpuslice.devcluster.cluster import DevCluster
from gpuslice.kube.client import KubeClient
from gpuslice.kube.discovery import served_resources


async def test_resource_api_is_served_in_v1(kube: KubeClient, cluster: DevCluster) -> None:
    served = await served_resources(kube, "resource.k8s.io")
    assert {"resourceslices", "deviceclasses", "resourceclaims", "resourceclaimtemplates"} <= set(served["v1"])
    assert cluster.features is not None
    rules = [version for version, resources in served.items() if "devicetaintrules" in resources]
    assert rules == ([cluster.features.taint_rule_version] if cluster.features.taint_rule_version else [])


async def test_version_is_the_one_we_built(kube: KubeClient, cluster: DevCluster) -> None:
    version = await kube.get("/version")
    assert version["gitVersion"] == cluster.kubernetes_version
    assert version["gitVersion"].startswith("v1.")


async def test_fake_gpu_nodes_are_ready_and_untainted(kube: KubeClient, cluster: DevCluster) -> None:
    nodes = {n["metadata"]["name"]: n for n in await kube.list("/api/v1/nodes")}
    assert set(cluster.node_names) <= set(nodes)
    for name in cluster.node_names:
        node = nodes[name]
        assert node["metadata"]["labels"]["gpuslice.dev/fake-gpu-model"] == cluster.spec.gpu_model
        assert node["metadata"]["labels"]["gpuslice.dev/fake-gpu-count"] == str(cluster.spec.gpus_per_node)
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert [c["status"] for c in ready] == ["True"]
        assert not node["spec"].get("taints"), "TaintNodesByCondition must be off for kubelet-less nodes"
