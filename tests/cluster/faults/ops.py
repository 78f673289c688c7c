"""What the fault tests do to the cluster and read from it."""

from __future__ import annotations

import ssl
from typing import Any

import aiohttp

from gpuslice.devcluster.cluster import DevCluster
from gpuslice.devcluster.process import Component
from gpuslice.dra.names import DRIVER
from gpuslice.kube.client import KubeClient, KubeError
from tests.cluster.faults.invariants import complete_pools
from tests.cluster.kubeutil import pod_claim, pod_with_claim, wait_for

RESOURCE = "/apis/resource.k8s.io/v1"


async def pool_slices(kube: KubeClient, node: str) -> list[dict[str, Any]]:
    return [s for s in await kube.list(f"{RESOURCE}/resourceslices", fieldSelector=f"spec.nodeName={node}")
            if s["spec"]["driver"] == DRIVER]


async def devices(kube: KubeClient, node: str) -> dict[str, dict[str, Any]] | None:
    """The node's devices as the scheduler sees them; None while the pool is incomplete."""
    pools, _ = complete_pools(await pool_slices(kube, node))
    return pools.get(node) if pools else None


async def settled_devices(kube: KubeClient, node: str, within: float = 30) -> dict[str, dict[str, Any]]:
    """The node's devices once its pool is complete (an agent between the writes of a generation
    shows none); {} when the node publishes nothing."""
    async def check() -> tuple[dict[str, dict[str, Any]]] | None:
        pools, incomplete = complete_pools(await pool_slices(kube, node))
        return None if node in incomplete else (pools.get(node) or {},)

    found: tuple[dict[str, dict[str, Any]]] = await wait_for(check, within=within, what=f"a complete pool on {node}")
    return found[0]


def of_policy(found: dict[str, dict[str, Any]] | None, policy: str) -> dict[str, dict[str, Any]]:
    return {n: d for n, d in (found or {}).items()
            if d["attributes"].get("gpuslice.dev/policy", {}).get("string") == policy}


async def wait_devices(kube: KubeClient, node: str, policy: str, count: int, infix: str = "",
                       within: float = 60) -> dict[str, dict[str, Any]]:
    """Wait until ``policy`` has exactly ``count`` devices (whose names contain ``infix``) on ``node``."""
    async def check() -> dict[str, dict[str, Any]] | None:
        found = {n: d for n, d in of_policy(await devices(kube, node), policy).items() if infix in n}
        return found if len(found) == count else None

    result: dict[str, dict[str, Any]] = await wait_for(
        check, within=within, what=f"{count} devices '{infix}' of {policy} on {node}")
    return result


async def alone_on(kube: KubeClient, node: str, policy: str) -> None:
    """Until the earlier tests' policies have left ``node``: their namespaces go after them, and
    devices still held there share the GPUs' counters, so the scheduler could not place the pods."""
    async def alone() -> bool:
        found = await devices(kube, node)
        return found is not None and set(of_policy(found, policy)) == set(found)

    await wait_for(alone, within=180, what=f"the devices of earlier tests' policies to leave {node}")


async def create_pods(kube: KubeClient, namespace: str, template: str, names: list[str]) -> None:
    for name in names:
        await kube.create(f"/api/v1/namespaces/{namespace}/pods", pod_with_claim(name, template))


async def settled(kube: KubeClient, namespace: str, pods: list[str], within: float = 120) -> list[dict[str, Any]]:
    """Wait until every pod is bound or found unschedulable (nothing fits: not a scheduler error, which is
    retried); the bound pods' allocation results."""
    async def check() -> list[dict[str, Any]] | None:
        results: list[dict[str, Any]] = []
        for name in pods:
            pod = await kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
            if pod["spec"].get("nodeName"):
                claim = await pod_claim(kube, namespace, name)
                allocation = ((claim or {}).get("status") or {}).get("allocation")
                if not allocation:
                    return None
                results += allocation["devices"]["results"]
            elif not any(c["type"] == "PodScheduled" and c["status"] == "False" and c.get("reason") == "Unschedulable"
                         for c in (pod.get("status") or {}).get("conditions") or []):
                return None  # not tried yet, or failed for another reason (e.g. a refused write) and retried
        return results

    found: list[dict[str, Any]] = await wait_for(check, within=within, what=f"pods {pods} bound or unschedulable")
    return found


async def allocated(kube: KubeClient, namespace: str, pods: list[str]) -> list[dict[str, Any]]:
    """The allocation results of the pods' claims, now."""
    results: list[dict[str, Any]] = []
    for name in pods:
        claim = await pod_claim(kube, namespace, name)
        results += (((claim or {}).get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", [])
    return results


async def scheduler_metric(cluster: DevCluster, name: str) -> float:
    """A sample of the kube-scheduler's own metrics (read directly: it does not need the API server)."""
    insecure = ssl.create_default_context()
    insecure.check_hostname, insecure.verify_mode = False, ssl.CERT_NONE
    async with aiohttp.ClientSession() as session, session.get(cluster.scheduler_metrics, ssl=insecure) as response:
        text = await response.text()
    for line in text.splitlines():
        key, _, value = line.rpartition(" ")
        if key == name:
            return float(value)
    return 0.0


async def binding(cluster: DevCluster) -> float:
    """Pods the scheduler has decided on and is binding (their claims' allocations not yet written)."""
    return await scheduler_metric(cluster, 'scheduler_goroutines{operation="binding"}')


async def agent_metrics(component: Component) -> dict[str, float]:
    """An agent's Prometheus samples, read from its --metrics-port (not through the API server)."""
    port = next(a.split("=", 1)[1] for a in component.argv if a.startswith("--metrics-port="))
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as response:
        text = await response.text()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            samples[key] = float(value)
    return samples


async def delete_pods(kube: KubeClient, namespace: str, pods: list[str]) -> None:
    for name in pods:
        try:
            await kube.delete(f"/api/v1/namespaces/{namespace}/pods/{name}", gracePeriodSeconds=0)
        except KubeError as error:
            if error.status != 404:
                raise
