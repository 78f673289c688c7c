"""Shared by the maxMemory tests (here and elsewhere): a tenant with a maxMemory in force, its
claims and pods, its ledger, and what its pods' Events say."""

from __future__ import annotations

from typing import Any

from gpuslice.dra.quantity import quantity_bytes
from gpuslice.kube.client import KubeClient, KubeError
from tests.cluster.claims import claim, pod_using, request
from tests.cluster.gpu_nodes import GpuNodeFactory
from tests.cluster.kubeutil import POLICIES, RESOURCE, on, wait_for
from tests.cluster.operator_fixtures import PolicyFactory
from tests.cluster.pools import published

LEDGERS = "/apis/gpuslice.dev/v1alpha1/namespaces/gpuslice-system/gpusliceledgers"
GI = 2**30


async def memory_in_force(kube: KubeClient, policy: str, ns: str, max_memory: str) -> None:
    """The tenant's record says its maxMemory is in force (its ledger counted it)."""
    async def check() -> bool:
        status = (await kube.get(f"{POLICIES}/{policy}")).get("status") or {}
        return any(a["namespace"] == ns and (a.get("limits") or {}).get("maxMemory") == max_memory
                   for a in status.get("admittedTenants") or [])

    try:
        await wait_for(check, within=60, what=f"the maxMemory of {ns} in {policy} to be in force")
    except AssertionError as error:
        status = (await kube.get(f"{POLICIES}/{policy}")).get("status") or {}
        found = await kube.list(LEDGERS)
        labels = (await kube.get(f"/api/v1/namespaces/{ns}"))["metadata"].get("labels")
        raise AssertionError(f"{error}; admittedTenants {status.get('admittedTenants')}, conditions"
                             f" {status.get('conditions')}, ledgers {found}, labels {labels}") from None


async def admits(kube: KubeClient, ns: str, klass: str) -> None:
    """The API server admits a claim of ``klass`` in ``ns`` (its admission sees the record a moment
    after the controller wrote it)."""
    async def dry_run() -> bool:
        try:
            await kube.create(f"{RESOURCE}/namespaces/{ns}/resourceclaims", claim("probe", request(klass)),
                              dryRun="All")
        except KubeError as error:
            if error.status == 403 and "try again in a moment" in error.message:
                return False
            raise
        return True

    await wait_for(dry_run, within=30, what=f"claims of {klass} to be admitted in {ns}")


async def budget_policy(kube: KubeClient, make_policy: PolicyFactory, gpu_node: GpuNodeFactory, namespace: str,
                        slicing: dict[str, Any], *, max_memory: str = "30Gi", gpus: int = 1, devices: int = 1,
                        **spec: Any) -> tuple[str, str, dict[str, dict[str, Any]]]:
    """A policy on a fresh node of ``gpus`` H100s whose tenant ``namespace`` has ``max_memory``, in force
    and admitted: (policy, its primary DeviceClass, the devices published)."""
    node = await gpu_node("h100-80gb", gpus)
    name = (await make_policy({"nodeSelector": on(node.name), "slicing": slicing,
                               "tenants": [{"namespace": namespace, "maxMemory": max_memory}], **spec}))["metadata"]["name"]
    found = await published(kube, node.name, devices)
    await memory_in_force(kube, name, namespace, max_memory)
    await admits(kube, namespace, f"{name}.gpuslice.dev")
    return name, f"{name}.gpuslice.dev", found


async def ledger(kube: KubeClient, policy: str, ns: str) -> dict[str, Any]:
    return await kube.get(f"{LEDGERS}/{policy}.{ns}")


async def claim_with_pod(kube: KubeClient, ns: str, name: str, body: dict[str, Any]) -> None:
    await kube.create(f"{RESOURCE}/namespaces/{ns}/resourceclaims", body)
    await kube.create(f"/api/v1/namespaces/{ns}/pods", pod_using(name, name))


def memory_claim(name: str, klass: str, gib: int, **fields: Any) -> dict[str, Any]:
    return claim(name, request(klass, capacity={"requests": {"memory": f"{gib}Gi"}}, **fields))


async def refused_at_allocation(kube: KubeClient, ns: str, pod: str, text: str) -> str:
    async def said() -> str | None:
        for event in await kube.list(f"/api/v1/namespaces/{ns}/events"):
            if event["involvedObject"]["name"] == pod and text in (event.get("message") or ""):
                return str(event["message"])
        return None

    found: str = await wait_for(said, within=60, what=f"{ns}/{pod}'s Events to say {text!r}")
    return found


async def held_gib(kube: KubeClient, ns: str) -> float:
    total = 0
    for item in await kube.list(f"{RESOURCE}/namespaces/{ns}/resourceclaims"):
        for result in ((item.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", []):
            total += int(_bytes((result.get("consumedCapacity") or {}).get("memory", "0")))
    return total / GI


def sample(text: str, metric: str, labels: str) -> float | None:
    """One sample of Prometheus text, by name and labels as served (sorted)."""
    for line in text.splitlines():
        if line.startswith(f"{metric}{{{labels}}} "):
            return float(line.rsplit(" ", 1)[1])
    return None


def _bytes(text: str) -> int:
    return quantity_bytes(text)


async def shared_tenant(kube: KubeClient, make_policy: PolicyFactory, gpu_node: GpuNodeFactory,
                        namespace: str) -> tuple[str, dict[str, int]]:
    """A shared policy (1Gi steps) on one H100 whose tenant has maxMemory 30Gi: (policy, each device's memory)."""
    name, _, devices = await budget_policy(kube, make_policy, gpu_node, namespace, {"mode": "shared", "sliceSize": "1Gi"})
    return name, {d: quantity_bytes(b["capacity"]["memory"]["value"]) for d, b in devices.items()}
