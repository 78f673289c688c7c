"""A tenant's limit is memory, and it holds for any claim the tenant can write: CEL selectors,
other kinds of device, firstAvailable, counts, allocationMode All, capacity requests and
extended resources. Real agents publish, the real scheduler allocates, the apiserver's quota
and the tenancy admission policy refuse."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from gpuslice.devcluster.cluster import DevCluster
from gpuslice.dra.quantity import quantity_bytes
from gpuslice.kube.client import KubeClient, KubeError
from tests.cluster.claims import allocation, claim, event_saying, pod_event, pod_using, refused, request
from tests.cluster.gpu_nodes import GpuNodeFactory
from tests.cluster.kubeutil import (
    PAUSE_IMAGE,
    POLICIES,
    RESOURCE,
    ClusterObjects,
    get_or_none,
    pod_claim,
    pod_with_claim,
    wait_for,
)
from tests.cluster.observe import scheduler_attempts
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory, judged_before_the_policy
from tests.cluster.pools import published
from tests.cluster.tenancy import ready_tenant

G = 10**9


def extended_pod(name: str, resource: str, count: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": PAUSE_IMAGE, "resources": {"limits": {resource: str(count)}}}]}}


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
    cluster: DevCluster, kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
    gpu_node: GpuNodeFactory, namespace: str, unique: str,
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
    await scheduler_attempts(cluster, 2)  # refused, never parked: tried again with a backoff
    assert await held_memory(kube, namespace, devices) == 10 * G

    async def reported() -> dict[str, Any] | None:
        status = (await kube.get(f"{POLICIES}/{name}")).get("status") or {}
        [tenant] = status.get("tenants") or [{}]
        return tenant if tenant.get("allocatedBytes") == 10 * G else None

    tenant = await wait_for(reported, within=30, what="status to show the memory held")
    assert tenant["limitBytes"] == 10 * G
    assert tenant["kinds"] == [{"kind": "slice", "allocated": 1, "limit": 1}, {"kind": "full", "allocated": 0, "limit": 0}]


async def allocated_or_refused(kube: KubeClient, ns: str, pod: str, text: str) -> str:
    """Wait until the pod's claim (named after the pod) is allocated, or an Event on the pod says ``text``;
    the Event's message, or "" when allocated."""
    async def check() -> str | None:
        if await allocation(kube, ns, pod):
            return "allocated"
        return await event_saying(kube, ns, pod, text)

    try:
        found: str = await wait_for(check, within=60, what=f"{ns}/{pod} to be allocated or refused ({text!r})")
    except AssertionError as error:
        said = [e.get("message") for e in await kube.list(f"/api/v1/namespaces/{ns}/events")
                if e["involvedObject"]["name"] == pod]
        raise AssertionError(f"{error}; the pod's Events: {said}") from None
    return found


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
    words = (f"has a limit in GpuSlicePolicy {name}, so each allocation of its devices is at most one device of its DeviceClass", f"{klass}: 10G",)
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


async def test_no_other_device_class_reaches_a_policys_devices(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, gpu_node: GpuNodeFactory,
    namespaces: Callable[..., Awaitable[str]], cluster_objects: ClusterObjects, unique: str,
) -> None:
    """Tenancy and limits are judged by the class a claim names. A DeviceClass that is not
    gpuslice's but selects its driver (a catch-all an administrator made, another vendor's class
    with a loose selector) must not be a way around them: neither for a stranger nor for a tenant
    limited to one slice, who would otherwise take a whole GPU (and tolerate every taint)."""
    stranger, tenant = await namespaces("stranger"), await namespaces("tenant")
    node = await gpu_node("h100-80gb", 1)
    name = (await make_policy({"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node.name}},
                               "slicing": {"mode": "memory", "sliceSize": "10G", "allowFullGpu": True},
                               "tenants": [{"namespace": tenant, "maxSlices": 1}]}))["metadata"]["name"]
    await published(kube, node.name, 9)
    await ready_tenant(kube, name, tenant)
    generic, elsewhere = f"any-gpu-{unique}", f"elsewhere-{unique}"
    for klass, selector in ((generic, 'device.driver.endsWith(".gpuslice.dev")'),
                            (elsewhere, 'device.driver == "none.example.com"')):
        await cluster_objects.create(f"{RESOURCE}/deviceclasses", {
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": klass},
            "spec": {"selectors": [{"cel": {"expression": selector}}]}})
    whole = [{"cel": {"expression": 'device.attributes["gpuslice.dev"].sliceSize == "full"'}}]
    exact = {"deviceClassName": generic, "tolerations": [{"operator": "Exists"}]}
    # Through firstAvailable too: the subrequest that would be satisfied is the generic one.
    either = [{"name": "none", "deviceClassName": elsewhere}, {"name": "any", "deviceClassName": generic}]
    # One at a time: a pod the scheduler keeps retrying holds its device in flight meanwhile.
    for ns, pod, spec in ((stranger, "grab", {"exactly": exact}),
                          (tenant, "whole", {"exactly": {**exact, "selectors": whole}}),
                          (stranger, "either", {"firstAvailable": either})):
        await kube.create(f"{RESOURCE}/namespaces/{ns}/resourceclaims", {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": pod},
            "spec": {"devices": {"requests": [{"name": "gpu", **spec}]}}})
        await kube.create(f"/api/v1/namespaces/{ns}/pods", pod_using(pod, pod))
        message = await allocated_or_refused(kube, ns, pod, "allocated only through the DeviceClasses")
        assert await allocation(kube, ns, pod) is None, f"{ns}/{pod} holds a gpuslice device through {generic}"
        assert f"allocation of ResourceClaim {pod}: devices of driver gpu.gpuslice.dev ({node.name}/" in message
        await kube.delete(f"/api/v1/namespaces/{ns}/pods/{pod}", gracePeriodSeconds=0)
    await ready_tenant(kube, name, tenant)


async def attempt(kube: KubeClient, ns: str, name: str, klass: str) -> str | None:
    """Try to make a claim of ``klass`` and a pod that uses it; the refusal's message, or None when made."""
    try:
        await kube.create(f"{RESOURCE}/namespaces/{ns}/resourceclaims", claim(name, request(klass)))
    except KubeError as error:
        return error.message
    await kube.create(f"/api/v1/namespaces/{ns}/pods", pod_using(name, name))
    return None


async def held_claims(kube: KubeClient, ns: str, names: list[str], text: str) -> list[str]:
    """Once the scheduler has tried each claim's pod (allocated, or an Event saying ``text``): those allocated."""
    for name in names:
        await allocated_or_refused(kube, ns, name, text)
    return [n for n in names if await allocation(kube, ns, n)]


async def test_claims_made_before_the_policy_are_never_allocated_to_a_limited_tenant(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, gpu_node: GpuNodeFactory,
    namespace: str, unique: str,
) -> None:
    """Before the policy exists nothing judges a claim of its (predictable) class in a namespace
    another policy names, and no quota counts it. Made early, such claims would all be allocated
    once the tenant is admitted, far beyond maxSlices. Only claims made after the tenant's quota
    exist are ever allocated to it."""
    await judged_before_the_policy(kube, make_policy, [namespace], f"p-{unique}.gpuslice.dev")
    early = [f"early-{i}" for i in range(3)]
    for name in early:
        assert await attempt(kube, namespace, name, f"p-{unique}.gpuslice.dev") is None
    node = await gpu_node("h100-80gb", 1)
    name = (await make_policy({"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node.name}},
                               "slicing": {"mode": "memory", "sliceSize": "10G"},
                               "tenants": [{"namespace": namespace, "maxSlices": 1}]}))["metadata"]["name"]
    devices = await published(kube, node.name, 8)
    await ready_tenant(kube, name, namespace)
    held = await held_claims(kube, namespace, early, "was made before the quota")
    assert held == [], f"a tenant with maxSlices: 1 holds {held}, made before its quota"
    message = await pod_event(kube, namespace, "early-0", "was made before the quota")
    assert (f"allocation of ResourceClaim early-0: the claim was made before the quota of namespace {namespace} for"
            f" GpuSlicePolicy {name} existed") in message
    assert "never allocated: delete it and make it again" in message
    # Made again now, one is counted and allocated.
    await kube.delete(f"/api/v1/namespaces/{namespace}/pods/early-0", gracePeriodSeconds=0)
    await kube.delete(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/early-0")
    await wait_for(lambda: _quota_used(kube, namespace, name, 2), what="the quota to count the two left")
    for early_name in early[1:]:  # the two left still count against the limit, as the quota says
        await kube.delete(f"/api/v1/namespaces/{namespace}/pods/{early_name}", gracePeriodSeconds=0)
        await kube.delete(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{early_name}")
    await wait_for(lambda: _quota_free(kube, namespace, name), what="the quota to release the early claims")
    assert await attempt(kube, namespace, "fresh", f"{name}.gpuslice.dev") is None
    await wait_for(lambda: _allocated(kube, namespace, "fresh"), within=60, what="a claim made now to be allocated")
    assert await held_memory(kube, namespace, devices) == 10 * G


async def _quota_used(kube: KubeClient, ns: str, policy: str, count: int) -> bool:
    quota = await kube.get(f"/api/v1/namespaces/{ns}/resourcequotas/gpuslice-{policy}")
    return str(count) in ((quota.get("status") or {}).get("used") or {}).values()


async def test_claims_of_a_kind_the_policy_does_not_offer_yet_are_refused(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, gpu_node: GpuNodeFactory,
    namespace: str,
) -> None:
    """A limited tenant's quota has a key per kind the policy offers. A class of a kind it does not
    offer yet (whole GPUs before allowFullGpu, a MIG profile before it is listed) is counted by no
    key: claims of it made now would be allocated, uncounted, once the platform team adds the kind."""
    node = await gpu_node("h100-80gb", 2)
    name = (await make_policy({"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node.name}},
                               "slicing": {"mode": "memory", "sliceSize": "10G"},
                               "tenants": [{"namespace": namespace, "maxSlices": 1}]}))["metadata"]["name"]
    await published(kube, node.name, 16)
    await ready_tenant(kube, name, namespace)
    full = f"full.{name}.gpuslice.dev"
    refusals = {pod: await attempt(kube, namespace, pod, full) for pod in ("whole-0", "whole-1")}
    await kube.merge_patch(f"{POLICIES}/{name}", {"spec": {"slicing": {"allowFullGpu": True}}})
    devices = await published(kube, node.name, 18)
    made = [pod for pod, refusal in refusals.items() if refusal is None]
    held = await held_claims(kube, namespace, made, "exceeded quota")
    assert held == [], f"a tenant granted no whole GPU holds {held}: {await held_memory(kube, namespace, devices)} bytes"
    for refusal in refusals.values():
        assert refusal is not None
        assert f"the quota of namespace {namespace} for GpuSlicePolicy {name} does not count this DeviceClass yet" in refusal
    # Once the kind is offered, its quota (0 for this tenant) counts it: refused by quota, as any other.
    await ready_tenant(kube, name, namespace, classes=2)
    assert "exceeded quota" in (await attempt(kube, namespace, "whole-2", full) or "")


async def test_a_tenant_given_limits_claims_under_them_only_once_they_are_in_force(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, gpu_node: GpuNodeFactory,
    namespace: str,
) -> None:
    """A tenant without limits has no quota. Given limits, it must not claim under the old record of
    it until its new quota counts: with the controller frozen (slow, or restarting), that is forever."""
    node = await gpu_node("h100-80gb", 1)
    name = (await make_policy({"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node.name}},
                               "slicing": {"mode": "memory", "sliceSize": "10G"},
                               "tenants": [{"namespace": namespace}]}))["metadata"]["name"]
    devices = await published(kube, node.name, 8)
    await ready_tenant(kube, name, namespace, quota=False)
    klass, rushed = f"{name}.gpuslice.dev", [f"rush-{i}" for i in range(3)]
    controller.pause()
    try:
        await kube.merge_patch(f"{POLICIES}/{name}", {"spec": {"tenants": [{"namespace": namespace, "maxSlices": 1}]}})
        # At once: a claim the apiserver admits in the moment before it reads the edit is made
        # before the new quota exists, so it is never allocated either.
        refusals = {pod: await attempt(kube, namespace, pod, klass) for pod in rushed}
        made = [pod for pod, refusal in refusals.items() if refusal is None]
        held = await held_claims(kube, namespace, made, f"GpuSlicePolicy {name}")
    finally:
        controller.resume()
    assert held == [], f"a tenant given maxSlices: 1 holds {held}, never counted by a quota"
    for refusal in refusals.values():
        assert refusal is None or f"the limits of namespace {namespace} in GpuSlicePolicy {name} changed" in refusal
    await ready_tenant(kube, name, namespace)
    if made:
        assert await held_claims(kube, namespace, made, "was made before the quota") == []
        for pod in made:
            await kube.delete(f"/api/v1/namespaces/{namespace}/pods/{pod}", gracePeriodSeconds=0)
            await kube.delete(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{pod}")
        await wait_for(lambda: _quota_free(kube, namespace, name), what="the quota to release the rushed claims")
    assert await attempt(kube, namespace, "counted", klass) is None
    await wait_for(lambda: _allocated(kube, namespace, "counted"), within=60, what="a counted claim to be allocated")
    assert "exceeded quota" in (await attempt(kube, namespace, "more", klass) or "")
    assert await held_memory(kube, namespace, devices) == 10 * G


async def test_a_tenant_added_while_its_quota_counts_nothing_yet_waits(
    cluster: DevCluster, kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
    gpu_node: GpuNodeFactory, namespace: str,
) -> None:
    """A ResourceQuota counts from when kube-controller-manager has synced its status.hard, not from
    when it is made: the apiserver's quota admission reads status. With KCM stalled, a quota that
    merely exists counts nothing, so its tenant must not be admitted yet."""
    node = await gpu_node("h100-80gb", 1)
    name = (await make_policy({"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node.name}},
                               "slicing": {"mode": "memory", "sliceSize": "10G"}, "tenants": []}))["metadata"]["name"]
    devices = await published(kube, node.name, 8)
    klass, rushed = f"{name}.gpuslice.dev", [f"rush-{i}" for i in range(3)]
    quota = f"/api/v1/namespaces/{namespace}/resourcequotas/gpuslice-{name}"
    async with cluster.paused("kube-controller-manager"):
        await kube.merge_patch(f"{POLICIES}/{name}", {"spec": {"tenants": [{"namespace": namespace, "maxSlices": 1}]}})
        await wait_for(lambda: get_or_none(kube, quota), within=30, what="the quota to be made")
        await wait_for(lambda: _observed(kube, name), within=30, what="the controller to finish converging")
        refusals = {pod: await attempt(kube, namespace, pod, klass) for pod in rushed}
        made = [pod for pod, refusal in refusals.items() if refusal is None]
        held = await held_claims(kube, namespace, made, f"GpuSlicePolicy {name}")
    assert held == [], f"a tenant with maxSlices: 1 holds {held}, which no quota counted"
    for refusal in refusals.values():
        assert refusal is not None
        assert "but gpuslice has not put its quota in place yet" in refusal
    await ready_tenant(kube, name, namespace)
    assert await attempt(kube, namespace, "counted", klass) is None
    assert "exceeded quota" in (await attempt(kube, namespace, "more", klass) or "")
    await wait_for(lambda: _allocated(kube, namespace, "counted"), within=60, what="a counted claim to be allocated")
    assert await held_memory(kube, namespace, devices) == 10 * G


async def _observed(kube: KubeClient, policy: str) -> bool:
    body = await kube.get(f"{POLICIES}/{policy}")
    return bool((body.get("status") or {}).get("observedGeneration") == body["metadata"]["generation"])
