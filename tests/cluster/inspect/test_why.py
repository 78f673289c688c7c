"""``gpuslice why``: a Pending pod explained in the platform's terms, from what the cluster really did."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from gpuslice.devcluster.cluster import DevCluster
from gpuslice.kube.client import KubeClient
from tests.cluster.cli import VIEWER, Cli, findings, impersonating, run_cli, warning
from tests.cluster.gpu_nodes import GpuNodeFactory
from tests.cluster.kubeutil import PAUSE_IMAGE, on, pod_with_claim, policy_ready, wait_for
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory
from tests.cluster.pools import create_pods, published, settle


async def test_over_the_limit_by_how_much(
    cluster: DevCluster, kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
    gpu_node: GpuNodeFactory, namespace: str, gpuslice: Cli,
) -> None:
    node = await gpu_node("h100-80gb", 1)
    policy = await make_policy({"nodeSelector": on(node.name), "slicing": {"mode": "memory", "sliceSize": "10G"},
                                "tenants": [{"namespace": namespace, "maxSlices": 2}]})
    await published(kube, node.name, 8)
    await create_pods(kube, namespace, "gpu-slice", ["a", "b"])
    await settle(cluster, kube, namespace, ["a", "b"], 2)
    await kube.create(f"/api/v1/namespaces/{namespace}/pods", pod_with_claim("c", "gpu-slice"))
    await warning(kube, namespace, "c", "FailedResourceClaimCreation")

    result = (await gpuslice("why", f"{namespace}/c", "-o", "json")).json()
    said = findings(result)
    name = policy["metadata"]["name"]
    assert result["findings"][0]["code"] == "OverLimit"
    assert (f"{namespace} may hold 2 x slice of {name} (20G) and its claims already count 2; this asks 1 more,"
            " 1 over the limit (10G of GPU memory)") in said["OverLimit"]
    assert "exceeded quota" in said["AdmissionDenied"]
    text = await gpuslice("why", "c", "-n", namespace)
    assert "OverLimit" in text.stdout


async def test_a_context_that_impersonates_in_its_namespace(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, gpu_node: GpuNodeFactory,
    namespace: str, cluster: DevCluster, viewer_kubeconfig: Path, tmp_path: Path,
) -> None:
    """The real API server judges the impersonated identity: the viewer's reads succeed, a user with no
    role is refused; and `why` with no pod lists the context's namespace."""
    node = await gpu_node("h100-80gb", 1)
    await make_policy({"nodeSelector": on(node.name), "slicing": {"mode": "memory", "sliceSize": "10G"},
                       "tenants": [{"namespace": namespace, "maxSlices": 1}]})
    await published(kube, node.name, 8)
    await create_pods(kube, namespace, "gpu-slice", ["a"])
    await settle(cluster, kube, namespace, ["a"], 1)
    await kube.create(f"/api/v1/namespaces/{namespace}/pods", pod_with_claim("b", "gpu-slice"))
    await warning(kube, namespace, "b", "FailedResourceClaimCreation")

    viewer = f"system:serviceaccount:{VIEWER[0]}:{VIEWER[1]}"
    config = impersonating(cluster, tmp_path / "as-viewer", viewer, namespace)
    gpuslice = [sys.executable, "-m", "gpuslice"]
    listed = await run_cli(gpuslice, "why", "--context", "as-user", "-o", "json", "--kubeconfig", str(config))
    by_subject = {d["subject"]: d for d in listed.json()}
    assert by_subject[f"{namespace}/b"]["findings"][0]["code"] == "OverLimit"
    config = impersonating(cluster, tmp_path / "as-nobody", "nobody-at-all", namespace)
    denied = await run_cli(gpuslice, "why", "b", "--context", "as-user", "--kubeconfig", str(config))
    assert denied.rc == 1
    assert 'User "nobody-at-all" cannot list' in denied.stderr, denied.stderr
    assert "bind the ClusterRole gpuslice-viewer" in denied.stderr


async def test_not_a_tenant_even_the_device_plugin_way(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, gpu_node: GpuNodeFactory,
    namespace: str, namespaces: Any, gpuslice: Cli, unique: str,
) -> None:
    node = await gpu_node("h100-80gb", 1)
    resource = f"example.com/why-{unique}"
    policy = await make_policy({"nodeSelector": on(node.name), "slicing": {"mode": "memory", "sliceSize": "10G"},
                                "tenants": [{"namespace": namespace}], "extendedResourceName": resource})
    await published(kube, node.name, 8)
    outsider = await namespaces("outsider")
    await kube.create(f"/api/v1/namespaces/{outsider}/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "legacy"},
        "spec": {"containers": [{"name": "c", "image": PAUSE_IMAGE, "resources": {"limits": {resource: "1"}}}]}})
    await warning(kube, outsider, "legacy", "FailedScheduling")

    result = (await gpuslice("why", f"{outsider}/legacy", "-o", "json")).json()
    name = policy["metadata"]["name"]
    assert [r["deviceClass"] for r in result["requests"]] == [f"{name}.gpuslice.dev"]
    assert result["findings"][0]["code"] == "NotATenant"
    assert f"Namespace {outsider} is not a tenant of GpuSlicePolicy {name} (tenants: {namespace})" in \
        result["findings"][0]["message"]
    assert "denied request" in findings(result)["AdmissionDenied"]


async def test_slices_kept_off_by_a_maintenance_taint(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, gpu_node: GpuNodeFactory,
    namespace: str, gpuslice: Cli,
) -> None:
    node = await gpu_node("h100-80gb", 1)
    policy = await make_policy({"nodeSelector": on(node.name), "slicing": {"mode": "memory", "sliceSize": "10G"},
                                "tenants": [{"namespace": namespace}],
                                "taints": [{"key": "gpuslice.dev/maintenance", "value": "planned",
                                            "effect": "NoSchedule"}]})
    await published(kube, node.name, 8)

    async def tainted() -> bool:
        # The taint reaches the devices a moment after they are published: the pod comes after it.
        status = (await gpuslice("status", "-o", "json")).json()
        [gpu] = next(n for n in status["map"]["nodes"] if n["name"] == node.name)["gpus"]
        return [s["state"] for s in gpu["segments"]].count("tainted") == 8

    await wait_for(tainted, within=60, what="every slice to carry the maintenance taint")
    await create_pods(kube, namespace, "gpu-slice", ["waits"])
    await warning(kube, namespace, "waits", "FailedScheduling")

    async def explained() -> dict[str, Any] | None:
        result = (await gpuslice("why", f"{namespace}/waits", "-o", "json")).json()
        return result if "KeptOff" in findings(result) else None

    result = await wait_for(explained, within=60, what="why to see the taint on every slice")
    name = policy["metadata"]["name"]
    said = findings(result)
    assert said["NoFreeDevice"].startswith(f"No free slice of {name} on any of its 1 nodes (1 asked, 0 free).")
    assert f"8 x slice of {name} would fit but are kept off: maintenance: planned ({node.name} GPU 0)" in \
        said["KeptOff"]


async def test_no_whole_gpu_free_shows_the_largest_free_one(
    cluster: DevCluster, kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
    gpu_node: GpuNodeFactory, namespace: str, gpuslice: Cli,
) -> None:
    node = await gpu_node("h100-80gb", 1)
    policy = await make_policy({"nodeSelector": on(node.name),
                                "slicing": {"mode": "memory", "sliceSize": "10G", "allowFullGpu": True},
                                "tenants": [{"namespace": namespace}]})
    await published(kube, node.name, 9)
    await create_pods(kube, namespace, "gpu-slice", ["small"])
    await settle(cluster, kube, namespace, ["small"], 1)
    await create_pods(kube, namespace, "gpu-slice-full", ["whole"])
    await warning(kube, namespace, "whole", "FailedScheduling")
    name = policy["metadata"]["name"]
    await policy_ready(kube, name)

    result = (await gpuslice("why", f"{namespace}/whole", "-o", "json")).json()
    assert result["findings"][0]["code"] == "NoFreeDevice"
    assert result["findings"][0]["message"] == (
        f"No free whole GPU of {name} on any of its 1 nodes (1 asked, 0 free). The largest free one: slice (10G)"
        f" on {node.name} GPU 0.")
    small = (await gpuslice("why", f"{namespace}/small", "-o", "json")).json()
    assert [f["code"] for f in small["findings"] if f["blocking"]] == []
    assert small["findings"][0]["code"] == "Allocated"


async def test_over_max_memory_says_what_the_namespace_holds_and_what_the_claim_asks(
    kube: KubeClient, controller: ControllerProcess, memory_webhook: Any, make_policy: PolicyFactory,
    gpu_node: GpuNodeFactory, namespace: str, gpuslice: Cli,
) -> None:
    from tests.cluster.claims import allocation
    from tests.cluster.webhook.budgets import budget_policy, claim_with_pod, memory_claim

    name, klass, _ = await budget_policy(kube, make_policy, gpu_node, namespace, {"mode": "shared", "sliceSize": "1Gi"})
    # a and b allocated first: the scheduler takes pods in no set order, and whichever comes third is refused.
    for pod, gib in (("a", 20), ("b", 8)):
        await claim_with_pod(kube, namespace, pod, memory_claim(pod, klass, gib))
        await wait_for(lambda pod=pod: allocation(kube, namespace, pod), within=60, what=f"{pod} to be allocated")
    await claim_with_pod(kube, namespace, "c", memory_claim("c", klass, 4))
    await warning(kube, namespace, "c", "FailedScheduling")
    result = (await gpuslice("why", f"{namespace}/c", "-o", "json")).json()
    said = findings(result)
    assert result["findings"][0]["code"] == "OverMemory", result
    assert (f"namespace {namespace} holds 28Gi of its 30Gi maxMemory in policy {name}; this claim asks 4Gi"
            in said["OverMemory"])
    assert "maxmemory.gpuslice.dev" in said["AdmissionDenied"]
    status = await gpuslice("status")
    assert "28Gi / 30Gi maxMemory" in status.stdout, status.stdout
