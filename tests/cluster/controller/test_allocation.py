"""Tenancy where allocation happens: whatever a claim's history, the scheduler's write of its
allocation is judged. Node agents publish real devices on fake GPU nodes and the real
kube-scheduler allocates them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from gpuslice.devcluster.cluster import DevCluster
from gpuslice.kube.client import KubeClient, KubeError
from gpuslice.planning.cluster.admission import binding as binding_of
from gpuslice.planning.cluster.tenancy_rule import NON_TENANTS, TENANCY, tenancy_binding
from tests.cluster.claims import allocation, event_saying, pod_event, pod_using
from tests.cluster.gpu_nodes import GpuNodeFactory
from tests.cluster.kubeutil import (
    NO_NODES,
    POLICIES,
    RESOURCE,
    condition,
    get_or_none,
    pod_claim,
    pod_with_claim,
    wait_for,
)
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory, judged_before_the_policy
from tests.cluster.pools import pool_devices as published_now
from tests.cluster.pools import published
from tests.cluster.tenancy import claim, dry_run_admitted

VAP = "/apis/admissionregistration.k8s.io/v1"


async def test_claims_made_before_the_policy_get_nothing_outside_its_rules(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, gpu_node: GpuNodeFactory,
    namespaces: Callable[..., Awaitable[str]], unique: str,
) -> None:
    """A claim made before the policy existed (or in the seconds before its admission rule was in
    force) carries the finalizer from the start, so the scheduler writes only its status: that
    write is refused, the pod waits, and its Events say why. (Such a claim can be made only in a
    namespace some other policy names: anywhere else it is refused when made.)"""
    tenant, stranger = await namespaces("tenant"), await namespaces("stranger")
    klass = f"p-{unique}.gpuslice.dev"  # the class of the policy make_policy creates below
    await judged_before_the_policy(kube, make_policy, [tenant, stranger], klass)
    for ns, name, body in ((stranger, "early", claim("early", klass)),
                           (tenant, "tolerant", claim("tolerant", klass))):
        if name == "tolerant":
            body["spec"]["devices"]["requests"][0]["exactly"]["tolerations"] = [{"operator": "Exists"}]
        body["metadata"]["finalizers"] = ["resource.kubernetes.io/delete-protection"]
        await kube.create(f"{RESOURCE}/namespaces/{ns}/resourceclaims", body)
        await kube.create(f"/api/v1/namespaces/{ns}/pods", pod_using(name, name))

    node = await gpu_node("h100-80gb", 1)
    await make_policy({"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node.name}},
                       "slicing": {"mode": "memory", "sliceSize": "10G"}, "tenants": [{"namespace": tenant}]})
    await published(kube, node.name, 8)
    await wait_for(lambda: get_or_none(kube, f"{RESOURCE}/namespaces/{tenant}/resourceclaimtemplates/gpu-slice"),
                   what="the template")
    await kube.create(f"/api/v1/namespaces/{tenant}/pods", pod_with_claim("worker", "gpu-slice"))

    async def worker_allocated() -> bool:
        found = await pod_claim(kube, tenant, "worker")
        return bool(found and (found.get("status") or {}).get("allocation"))

    await wait_for(worker_allocated, within=60, what="the tenant's ordinary claim to be allocated")
    for ns, name, text in ((stranger, "early", "is not a tenant"), (tenant, "tolerant", "tolerates a taint")):
        async def settled(ns: str = ns, name: str = name, text: str = text) -> bool:
            return bool(await allocation(kube, ns, name) or await event_saying(kube, ns, name, text))

        await wait_for(settled, within=60, what=f"the scheduler to try {ns}/{name}")
        assert await allocation(kube, ns, name) is None, f"{ns}/{name} was allocated"
    message = await pod_event(kube, stranger, "early", "is not a tenant of GpuSlicePolicy")
    assert f"allocation of ResourceClaim early: namespace {stranger} is not a tenant of GpuSlicePolicy p-{unique}" in message
    message = await pod_event(kube, tenant, "tolerant", "tolerates a taint that tenants may not tolerate")
    assert "allocation of ResourceClaim tolerant" in message
    assert await allocation(kube, stranger, "early") is None
    assert await allocation(kube, tenant, "tolerant") is None


async def _two_tenants_on_a_node(kube: KubeClient, make_policy: PolicyFactory, gpu_node: GpuNodeFactory,
                                 namespaces: Callable[..., Awaitable[str]]) -> tuple[str, str, str]:
    """Tenants ``leaving`` and ``staying`` of a 10G memory policy on one H100 node, published."""
    leaving, staying = await namespaces("leaving"), await namespaces("staying")
    node = await gpu_node("h100-80gb", 1)
    name = (await make_policy({"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node.name}},
                               "slicing": {"mode": "memory", "sliceSize": "10G"},
                               "tenants": [{"namespace": leaving}, {"namespace": staying}]}))["metadata"]["name"]
    await published(kube, node.name, 8)
    return leaving, staying, name


async def test_an_allocation_left_outside_the_tenants_is_reported_and_released(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, gpu_node: GpuNodeFactory,
    namespaces: Callable[..., Awaitable[str]],
) -> None:
    leaving, staying, name = await _two_tenants_on_a_node(kube, make_policy, gpu_node, namespaces)
    await wait_for(lambda: get_or_none(kube, f"{RESOURCE}/namespaces/{leaving}/resourceclaimtemplates/gpu-slice"),
                   what="the template")
    await kube.create(f"/api/v1/namespaces/{leaving}/pods", pod_with_claim("worker", "gpu-slice"))

    async def held() -> dict[str, Any] | None:
        found = await pod_claim(kube, leaving, "worker")
        return found if found and (found.get("status") or {}).get("allocation") else None

    held_claim = await wait_for(held, within=60, what="the claim to be allocated")
    await kube.merge_patch(f"{POLICIES}/{name}", {"spec": {"tenants": [{"namespace": staying}]}})

    async def reported() -> dict[str, Any] | None:
        body = await kube.get(f"{POLICIES}/{name}")
        return body if (body.get("status") or {}).get("foreignClaims") else None

    body = await wait_for(reported, within=30, what="the foreign claim in status")
    assert body["status"]["foreignClaims"] == [f"{leaving}/{held_claim['metadata']['name']}"]
    assert condition(body, "Degraded")["reason"] == "ForeignClaims"
    assert "delete these claims to return the devices" in condition(body, "Degraded")["message"]

    await kube.delete(f"/api/v1/namespaces/{leaving}/pods/worker", gracePeriodSeconds=0)
    path = f"{RESOURCE}/namespaces/{leaving}/resourceclaims/{held_claim['metadata']['name']}"
    await wait_for(lambda: _absent(kube, path), within=60, what="the claim to be released and deleted")

    async def cleared() -> bool:
        body = await kube.get(f"{POLICIES}/{name}")
        return not (body.get("status") or {}).get("foreignClaims") and condition(body, "Degraded")["status"] == "False"

    await wait_for(cleared, within=30, what="the report to clear")


async def test_a_removed_tenant_starts_no_new_pod_on_a_claim_it_holds(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, gpu_node: GpuNodeFactory,
    namespaces: Callable[..., Awaitable[str]],
) -> None:
    """A claim made by hand outlives its pods: once its namespace is no longer a tenant, the
    scheduler's reservation of it for one more pod is refused (the pod waits, its Events say why),
    while the pod that already had it keeps it and the claim can still be released."""
    leaving, staying, name = await _two_tenants_on_a_node(kube, make_policy, gpu_node, namespaces)
    claims = f"{RESOURCE}/namespaces/{leaving}/resourceclaims"
    await wait_for(lambda: _created(kube, claims, claim("held", f"{name}.gpuslice.dev")), within=30,
                   what="the tenant's claim to be admitted")
    await kube.create(f"/api/v1/namespaces/{leaving}/pods", pod_using("first", "held"))

    async def reserved() -> list[str] | None:
        status = (await kube.get(f"{claims}/held")).get("status") or {}
        return [r["name"] for r in status.get("reservedFor") or []] if status.get("allocation") else None

    assert await wait_for(reserved, within=60, what="the claim to be allocated to the first pod") == ["first"]
    await kube.merge_patch(f"{POLICIES}/{name}", {"spec": {"tenants": [{"namespace": staying}]}})
    await wait_for(lambda: _judged(kube, name), within=30, what="the edit to be judged")

    await kube.create(f"/api/v1/namespaces/{leaving}/pods", pod_using("second", "held"))
    message = await pod_event(kube, leaving, "second", f"is not a tenant of GpuSlicePolicy {name}")
    assert f"a new pod of ResourceClaim held: namespace {leaving} is not a tenant" in message
    assert await reserved() == ["first"], "the refused pod got no share of the claim"
    pod = await kube.get(f"/api/v1/namespaces/{leaving}/pods/second")
    assert not pod["spec"].get("nodeName"), "the refused pod was not bound"

    # The pod that had the claim keeps it; once it goes, the claim is released and can be deleted.
    for pod_name in ("first", "second"):
        await kube.delete(f"/api/v1/namespaces/{leaving}/pods/{pod_name}", gracePeriodSeconds=0)
    await kube.delete(f"{claims}/held")
    await wait_for(lambda: _absent(kube, f"{claims}/held"), within=60, what="the claim to be released and deleted")


async def _created(kube: KubeClient, path: str, body: dict[str, Any]) -> bool:
    """Create once the admission rule lets it (the policy's params reach the apiserver a moment later)."""
    try:
        await kube.create(path, body)
    except KubeError as error:
        return error.status == 409  # made by an earlier try
    return True


async def _judged(kube: KubeClient, name: str) -> bool:
    body = await kube.get(f"{POLICIES}/{name}")
    return (body.get("status") or {}).get("observedGeneration") == body["metadata"]["generation"]


async def _absent(kube: KubeClient, path: str) -> bool:
    return await get_or_none(kube, path) is None


async def test_nothing_is_published_until_tenancy_is_enforced(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, gpu_node: GpuNodeFactory,
) -> None:
    """Valid only once a non-tenant is refused a (dry-run) claim: proof, not a timer."""
    binding = f"{VAP}/validatingadmissionpolicybindings/{TENANCY}"
    await kube.delete(binding)
    try:
        canary = (await make_policy({"nodeSelector": NO_NODES, "slicing": {"mode": "memory", "sliceSize": "10Gi"}},
                                    suffix="-canary"))["metadata"]["name"]

        await wait_for(lambda: dry_run_admitted(kube, "gpuslice-system", f"{canary}.gpuslice.dev"),
                       what="the tenancy binding to stop applying")
        node = await gpu_node("h100-80gb", 1)
        name = (await make_policy({"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node.name}},
                                   "slicing": {"mode": "memory", "sliceSize": "10G"}}))["metadata"]["name"]

        seen: list[dict[str, Any]] = []

        async def not_enforced() -> dict[str, Any] | None:
            body = await kube.get(f"{POLICIES}/{name}")
            seen[:] = [condition(body, "Valid")]
            return body if seen[0].get("reason") == "TenancyNotEnforced" else None

        try:
            body = await wait_for(not_enforced, within=60, what="Valid=False, TenancyNotEnforced")
        except AssertionError as error:
            raise AssertionError(f"{error}; Valid was {seen}") from None
        assert condition(body, "Valid")["status"] == "False"
        assert "the apiserver admitted a dry-run ResourceClaim" in condition(body, "Valid")["message"]
        assert "Apply manifests/admission.yaml" in condition(body, "Valid")["message"]
        assert condition(body, "Ready")["reason"] == "TenancyNotEnforced"
        devices = [d for s in await kube.list(f"{RESOURCE}/resourceslices", fieldSelector=f"spec.nodeName={node.name}")
                   for d in s["spec"].get("devices") or []]
        assert devices == [], "no agent publishes a policy whose tenancy is not enforced"
    finally:
        await kube.apply(binding, tenancy_binding(), field_manager="gpuslice-tests")
    async def enforced() -> bool:
        body = await kube.get(f"{POLICIES}/{name}")
        return condition(body, "Valid").get("status") == "True"

    await wait_for(enforced, within=90, what="Valid once the binding is back (after the backoff)")
    await published(kube, node.name, 8)


async def test_tenancy_is_not_enforced_without_the_rule_for_namespaces_no_policy_names(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
) -> None:
    """The probe in the controller's namespace proves the rule with the parameter; the rule for the
    other namespaces is the same for every policy, and the probe checks that it is bound."""
    binding = f"{VAP}/validatingadmissionpolicybindings/{NON_TENANTS}"
    await kube.delete(binding)
    try:
        name = (await make_policy({"nodeSelector": NO_NODES, "slicing": {"mode": "memory", "sliceSize": "10Gi"}},
                                  suffix="-gate"))["metadata"]["name"]

        async def not_enforced() -> dict[str, Any] | None:
            body = await kube.get(f"{POLICIES}/{name}")
            return body if condition(body, "Valid").get("reason") == "TenancyNotEnforced" else None

        body = await wait_for(not_enforced, within=60, what="Valid=False, TenancyNotEnforced")
        assert "not enforced in namespaces no policy names" in condition(body, "Valid")["message"]
    finally:
        await kube.apply(binding, binding_of(NON_TENANTS), field_manager="gpuslice-tests")

    async def enforced() -> bool:
        return condition(await kube.get(f"{POLICIES}/{name}"), "Valid").get("status") == "True"

    await wait_for(enforced, within=90, what="Valid once the binding is back")


async def test_a_deleted_policy_stays_until_its_devices_are_gone(
    cluster: DevCluster, kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
    gpu_node: GpuNodeFactory, namespaces: Callable[..., Awaitable[str]],
) -> None:
    """The policy is the tenancy rule's parameter. Were it gone while its devices are still
    published (an agent down or slow to remove them) and its DeviceClass not yet garbage-collected,
    any namespace could claim them. So deletion waits for the agents too, and says so."""
    tenant, stranger = await namespaces("tenant"), await namespaces("stranger")
    node = await gpu_node("h100-80gb", 1)
    name = (await make_policy({"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node.name}},
                               "slicing": {"mode": "memory", "sliceSize": "10G"},
                               "tenants": [{"namespace": tenant}]}))["metadata"]["name"]
    await published(kube, node.name, 8)
    path = f"{POLICIES}/{name}"
    await node.agent.stop()
    try:
        # kube-controller-manager stalled: garbage collection leaves the DeviceClass in place meanwhile.
        async with cluster.paused("kube-controller-manager"):
            await kube.delete(path)

            async def handled() -> dict[str, Any] | bool:
                body = await get_or_none(kube, path)
                return True if body is None else body if condition(body, "Ready").get("reason") == "Deleting" else False

            body = await wait_for(handled, within=30, what="the controller to act on the deletion")
            refusal: KubeError | None = None
            try:
                await kube.create(f"{RESOURCE}/namespaces/{stranger}/resourceclaims", claim("grab", f"{name}.gpuslice.dev"))
            except KubeError as error:
                refusal = error
            if refusal is None:
                await kube.create(f"/api/v1/namespaces/{stranger}/pods", pod_using("grab", "grab"))
                await wait_for(lambda: allocation(kube, stranger, "grab"), within=30, what="the scheduler's choice")
                raise AssertionError(f"{stranger} holds a device of deleted policy {name}")
            assert f"namespace {stranger} is not a tenant of GpuSlicePolicy {name}" in refusal.message
            assert isinstance(body, dict), "the policy went while its devices were published"
            assert f"node agents of 1 nodes to remove this policy's devices: {node.name}" in condition(body, "Ready")[
                "message"]
    finally:
        await node.agent.start()
        await node.agent.wait_healthy()
    await wait_for(lambda: _absent(kube, path), within=60, what="the policy to go once its devices went")
    assert not await published_now(kube, node.name)
