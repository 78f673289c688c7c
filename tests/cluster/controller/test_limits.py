"""A tenant's limit is memory, and it holds for any claim the tenant can write: CEL selectors,
other kinds of device, firstAvailable, counts, allocationMode All, capacity requests and
extended resources. Real agents publish, the real scheduler allocates, the apiserver's quota
and the tenancy admission policy refuse."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpuslice.dra.quantity import quantity_bytes
from gpuslice.kube.client import KubeClient, KubeError
from tests.cluster.agent.conftest import GpuNodeFactory, agent_rbac, gpu_node
from tests.cluster.agent.test_publishing import published
from tests.cluster.controller.test_allocation import pod_event, pod_using
from tests.cluster.controller.test_objects import get_or_none
from tests.cluster.kubeutil import PAUSE_IMAGE, RESOURCE, pod_claim, pod_with_claim, wait_for
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory

__all__ = ["agent_rbac", "gpu_node"]
POLICIES = "/apis/gpuslice.dev/v1alpha1/gpuslicepolicies"
G = 10**9


def request(klass: str, **fields: Any) -> dict[str, Any]:
    return {"deviceClassName": klass, **fields}


def claim(name: str, exactly: dict[str, Any] | None = None, first: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    req: dict[str, Any] = {"name": "gpu"}
    if first is not None:
        req["firstAvailable"] = first
    else:
        req["exactly"] = exactly
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [req]}}}


def extended_pod(name: str, resource: str, count: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": PAUSE_IMAGE, "resources": {"limits": {resource: str(count)}}}]}}


async def refused(kube: KubeClient, ns: str, body: dict[str, Any], *words: str) -> str:
    with pytest.raises(KubeError) as error:
        await kube.create(f"{RESOURCE}/namespaces/{ns}/resourceclaims", body)
    assert error.value.status in (403, 422), error.value
    for word in words:
        assert word in error.value.message, error.value.message
    return error.value.message


async def ready_tenant(kube: KubeClient, policy: str, ns: str) -> None:
    """The tenant is admitted and its quota counts (before that every claim is refused anyway)."""
    async def counted() -> bool:
        body = await kube.get(f"{POLICIES}/{policy}")
        admitted = any(a["namespace"] == ns for a in (body.get("status") or {}).get("admittedTenants") or [])
        quota = await get_or_none(kube, f"/api/v1/namespaces/{ns}/resourcequotas/gpuslice-{policy}")
        return admitted and quota is not None and "used" in (quota.get("status") or {})

    await wait_for(counted, within=30, what=f"{ns} to be admitted with its quota counting")


async def held_memory(kube: KubeClient, ns: str, devices: dict[str, dict[str, Any]]) -> int:
    """GPU memory the namespace's claims hold, from the allocations themselves."""
    total = 0
    for item in await kube.list(f"{RESOURCE}/namespaces/{ns}/resourceclaims"):
        for result in ((item.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", []):
            consumed = (result.get("consumedCapacity") or {}).get("memory")
            total += quantity_bytes(consumed or devices[result["device"]]["capacity"]["memory"]["value"])
    return total


async def tried(kube: KubeClient, ns: str, pod: str) -> None:
    """The scheduler has placed the pod or given up on it for now."""
    async def check() -> bool:
        body = await kube.get(f"/api/v1/namespaces/{ns}/pods/{pod}")
        return any(c["type"] == "PodScheduled" for c in (body.get("status") or {}).get("conditions", []))

    await wait_for(check, within=60, what=f"the scheduler to try {ns}/{pod}")


async def test_a_slice_limit_is_a_memory_limit_whatever_the_claim(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, gpu_node: GpuNodeFactory,
    namespace: str, unique: str,
) -> None:
    # Two GPUs: the tenant's one slice on one, and the whole other free for the extended-resource
    # pod below to reach the quota (with one GPU, that pod's retries hold the whole GPU in flight
    # for a moment each, and a slice pod turned away then waits for an event that never comes).
    node = await gpu_node("h100-80gb", 2)
    resource = f"example.com/slice-{unique}"
    name = (await make_policy({"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node.name}},
                               "slicing": {"mode": "memory", "sliceSize": "10G", "allowFullGpu": True},
                               "tenants": [{"namespace": namespace, "maxSlices": 1}],
                               "extendedResourceName": resource}))["metadata"]["name"]
    slices, full = f"{name}.gpuslice.dev", f"full.{name}.gpuslice.dev"
    devices = await published(kube, node.name, 18)
    await ready_tenant(kube, name, namespace)
    ns_claims = f"{RESOURCE}/namespaces/{namespace}/resourceclaims"

    # A CEL selector on the slice class cannot reach the whole GPU: the class selects slices only.
    wide = request(slices, selectors=[{"cel": {"expression": 'device.attributes["gpuslice.dev"].sliceSize == "full"'}}])
    await kube.create(ns_claims, claim("wide", wide))
    await kube.create(f"/api/v1/namespaces/{namespace}/pods", pod_using("wide", "wide"))
    await tried(kube, namespace, "wide")
    held = await held_memory(kube, namespace, devices)
    assert held == 0, f"a maxSlices: 1 tenant holds {held} bytes through a selector"
    await kube.delete(f"/api/v1/namespaces/{namespace}/pods/wide", gracePeriodSeconds=0)
    await kube.delete(f"{ns_claims}/wide")

    # The whole GPU's own class: a limited tenant has a quota of 0 on it, however it asks.
    quota = f"{full}.deviceclass.resource.k8s.io/devices"
    await wait_for(lambda: _quota_free(kube, namespace, name), what="the quota to release the deleted claim")
    await refused(kube, namespace, claim("whole", request(full)), "exceeded quota", quota)
    await refused(kube, namespace, claim("either", first=[{"name": "big", **request(full)},
                                                           {"name": "small", **request(slices)}]), "exceeded quota", quota)
    await refused(kube, namespace, claim("two", request(slices, count=2)), "exceeded quota")
    await refused(kube, namespace, claim("all", request(slices, allocationMode="All")), "exceeded quota")
    await kube.create(f"/api/v1/namespaces/{namespace}/pods", pod_with_claim("one", "gpu-slice"))

    async def one_allocated() -> bool:
        found = await pod_claim(kube, namespace, "one")
        return bool(found and (found.get("status") or {}).get("allocation"))

    await wait_for(one_allocated, within=60, what="the tenant's one slice")
    # The extended-resource way: the scheduler's own claim for the pod is charged the same quota.
    await kube.create(f"/api/v1/namespaces/{namespace}/pods",
                      extended_pod("implicit", f"deviceclass.resource.kubernetes.io/{full}", 1))
    await kube.create(f"/api/v1/namespaces/{namespace}/pods", extended_pod("explicit", resource, 1))
    for pod in ("implicit", "explicit"):
        assert "exceeded quota" in await pod_event(kube, namespace, pod, "exceeded quota")
    await asyncio.sleep(3)
    assert await held_memory(kube, namespace, devices) == 10 * G

    async def reported() -> dict[str, Any] | None:
        status = (await kube.get(f"{POLICIES}/{name}")).get("status") or {}
        [tenant] = status.get("tenants") or [{}]
        return tenant if tenant.get("allocatedBytes") == 10 * G else None

    tenant = await wait_for(reported, within=30, what="status to show the memory held")
    assert tenant["limitBytes"] == 10 * G
    assert tenant["kinds"] == [{"kind": "slice", "allocated": 1, "limit": 1}, {"kind": "full", "allocated": 0, "limit": 0}]


async def _quota_free(kube: KubeClient, ns: str, policy: str) -> bool:
    quota = await kube.get(f"/api/v1/namespaces/{ns}/resourcequotas/gpuslice-{policy}")
    return all(v == "0" for v in ((quota.get("status") or {}).get("used") or {"x": "1"}).values())


async def test_shared_allocations_of_a_limited_tenant_are_one_slice_each(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, gpu_node: GpuNodeFactory,
    namespace: str,
) -> None:
    node = await gpu_node("h100-80gb", 2)
    name = (await make_policy({"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node.name}},
                               "slicing": {"mode": "shared", "sliceSize": "10G"},
                               "tenants": [{"namespace": namespace, "maxSlices": 2}]}))["metadata"]["name"]
    klass = f"{name}.gpuslice.dev"
    devices = await published(kube, node.name, 2)
    await ready_tenant(kube, name, namespace)
    words = (f"has a limit in GpuSlicePolicy {name}, so each allocation of its shared devices is one sliceSize (10G)",)
    await refused(kube, namespace, claim("whole", request(klass, capacity={"requests": {"memory": "80G"}})), *words)
    await refused(kube, namespace, claim("sly", first=[
        {"name": "a", **request(klass, capacity={"requests": {"memory": "30G"}})}]), *words)
    await refused(kube, namespace, claim("other-key", request(klass, capacity={"requests": {"gpu.gpuslice.dev/memory": "80G"}})),
                  *words)
    # count: 2 is two allocations (on two devices: the 1.37 allocator does not reuse a device within
    # one request), each one slice, two of the quota.
    await kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaims",
                      claim("pair", request(klass, count=2, capacity={"requests": {"memory": "10G"}})))
    await kube.create(f"/api/v1/namespaces/{namespace}/pods", pod_using("pair", "pair"))
    await wait_for(lambda: _allocated(kube, namespace, "pair"), within=60, what="the pair to be allocated")
    await refused(kube, namespace, claim("more", request(klass)), "exceeded quota")
    assert await held_memory(kube, namespace, devices) == 20 * G


async def _allocated(kube: KubeClient, ns: str, name: str) -> bool:
    body = await kube.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims/{name}")
    return bool((body.get("status") or {}).get("allocation"))
