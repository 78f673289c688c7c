"""A node's pool as its agent published it, and a tenant's pods scheduled onto it: waits on what
the API server holds, and the numbers the tests compare them with."""

from __future__ import annotations

from typing import Any

from gpuslice.agent.gpus.fake import FakeBackend
from gpuslice.devcluster.cluster import DevCluster
from gpuslice.dra.quantity import quantity_bytes
from gpuslice.inventory.catalog import MODELS
from gpuslice.kube.client import KubeClient
from gpuslice.planning.devices import gpu_tag
from tests.cluster.kubeutil import RESOURCE, get_or_none, pod_claim, pod_with_claim, wait_for
from tests.cluster.observe import scheduler_settled
from tests.cluster.operator_fixtures import PolicyFactory

GI = 1024**3
G = 10**9
H100 = MODELS["h100-80gb"].memory  # 81,559 MiB, as NVML reports an H100 80GB HBM3
SLICES = f"{RESOURCE}/resourceslices"


def tag(node: str, model: str = "h100-80gb", index: int = 0) -> str:
    """The name a fake GPU of ``node`` goes by in device and counter set names."""
    return gpu_tag(FakeBackend(node, [(model, index + 1)]).discover()[index].uuid)


async def pool(kube: KubeClient, node: str) -> list[dict[str, Any]]:
    return [s for s in await kube.list(SLICES, fieldSelector=f"spec.nodeName={node}")
            if s["spec"]["driver"] == "gpu.gpuslice.dev"]


async def pool_versions(kube: KubeClient, node: str) -> dict[str, str]:
    """Each of the pool's slices and its resourceVersion: equal snapshots mean nothing was written."""
    return {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in await pool(kube, node)}


async def pool_devices(kube: KubeClient, node: str) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in await pool(kube, node) for d in s["spec"].get("devices") or []}


async def published(kube: KubeClient, node: str, count: int) -> dict[str, dict[str, Any]]:
    async def check() -> dict[str, dict[str, Any]] | None:
        devices = await pool_devices(kube, node)
        return devices if len(devices) == count else None

    result: dict[str, dict[str, Any]] = await wait_for(check, within=30, what=f"{count} devices published on {node}")
    return result


async def tenant_policy(make_policy: PolicyFactory, namespace: str, node: str, slicing: dict[str, Any],
                        suffix: str = "", template: str = "gpu-slice") -> str:
    body = await make_policy({"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node}}, "slicing": slicing,
                              "tenants": [{"namespace": namespace}], "claimTemplateName": template}, suffix)
    return str(body["metadata"]["name"])


async def create_pods(kube: KubeClient, namespace: str, template: str, names: list[str]) -> None:
    """Create pods from a template once the tenancy policy admits its claims."""
    await wait_for(lambda: get_or_none(kube, f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates/{template}"),
                   what=f"template {template}")
    for name in names:
        await kube.create(f"/api/v1/namespaces/{namespace}/pods", pod_with_claim(name, template))


async def allocated_results(kube: KubeClient, namespace: str, pods: list[str]) -> list[dict[str, Any]]:
    """The allocation results of the claims the pods got from their template."""
    results: list[dict[str, Any]] = []
    for pod in pods:
        claim = await pod_claim(kube, namespace, pod)
        results += ((claim or {}).get("status", {}).get("allocation") or {}).get("devices", {}).get("results", [])
    return results


async def settle(cluster: DevCluster, kube: KubeClient, namespace: str, pods: list[str],
                 allocated: int) -> list[dict[str, Any]]:
    """Wait until exactly ``allocated`` pods are bound and the rest unschedulable, and the scheduler
    has tried them all since (nothing more fits); their results."""
    async def check() -> list[dict[str, Any]] | None:
        bound, unschedulable = 0, 0
        for name in pods:
            pod = await kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
            if pod["spec"].get("nodeName"):
                bound += 1
            elif any(c["type"] == "PodScheduled" and c["status"] == "False"
                     for c in (pod.get("status") or {}).get("conditions", [])):
                unschedulable += 1
        results = await allocated_results(kube, namespace, pods)
        return results if bound == allocated and unschedulable == len(pods) - allocated else None

    result: list[dict[str, Any]] = await wait_for(check, within=90, what=f"{allocated} of {len(pods)} pods allocated")
    await scheduler_settled(cluster)  # every unschedulable pod tried again since: nothing more may fit
    assert await check() is not None, "allocation changed after it settled"
    return result


def memory_of(devices: dict[str, dict[str, Any]], results: list[dict[str, Any]]) -> int:
    return sum(quantity_bytes(devices[r["device"]]["capacity"]["memory"]["value"]) for r in results)
