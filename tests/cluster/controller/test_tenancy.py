"""Tenant isolation, admin access and quota, enforced by the real apiserver."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from gpuslice.kube.client import KubeClient, KubeError
from gpuslice.planning.cluster.admission import ADMIN_LABEL_GUARD, binding
from tests.cluster.gpu_nodes import GpuNodeFactory
from tests.cluster.kubeutil import (
    NO_NODES,
    RESOURCE,
    condition,
    delete_namespace,
    get_or_none,
    pod_claim,
    pod_with_claim,
    wait_for,
)
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory, admin_label_guarded
from tests.cluster.tenancy import ADMIN_LABEL, claim, ready_policy, scheduling_events, valid

VAP = "/apis/admissionregistration.k8s.io/v1"


async def create_eventually(kube: KubeClient, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """Admission policies take effect a moment after they are created (the apiserver's
    informer): retry a create that the policy under test must allow."""
    last: KubeError | None = None

    async def attempt() -> dict[str, Any] | None:
        nonlocal last
        try:
            return await kube.create(path, body)
        except KubeError as error:
            last = error
            return None

    try:
        result: dict[str, Any] = await wait_for(attempt, within=15, what=f"create {path}")
    except AssertionError:
        raise AssertionError(f"create of {path} kept failing: {last}") from None
    return result


async def denied(kube: KubeClient, path: str, body: dict[str, Any]) -> KubeError:
    """Wait until the apiserver denies ``body`` (policies load asynchronously), then return the denial."""
    async def attempt() -> KubeError | None:
        try:
            created = await kube.create(path, body)
        except KubeError as error:
            return None if error.status == 409 else error  # 409: the last allowed attempt is still there
        await kube.delete(f"{path}/{created['metadata']['name']}")
        return None

    result: KubeError = await wait_for(attempt, within=15, what=f"a denial of {path}")
    return result


async def test_tenant_claims_admitted_others_denied_with_policy_message(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
    namespaces: Callable[..., Awaitable[str]],
) -> None:
    tenant, stranger = await namespaces("tenant"), await namespaces("stranger")
    name = await ready_policy(kube, make_policy, {"tenants": [{"namespace": tenant}]})
    klass = f"{name}.gpuslice.dev"

    # The template the controller made is usable by the tenant.
    template = await wait_for(lambda: get_or_none(kube, f"{RESOURCE}/namespaces/{tenant}/resourceclaimtemplates/gpu-slice"),
                              what="template")
    made = await create_eventually(kube, f"{RESOURCE}/namespaces/{tenant}/resourceclaims",
                                   {"metadata": {"name": "from-template"}, "spec": template["spec"]["spec"]})
    assert made["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == klass

    error = await denied(kube, f"{RESOURCE}/namespaces/{stranger}/resourceclaims", claim("sneaky", klass))
    assert error.status in (403, 422)
    assert f"namespace {stranger} is not a tenant of GpuSlicePolicy {name}" in error.message
    assert f"add it to spec.tenants of GpuSlicePolicy {name}" in error.message

    # Templates are checked too, and so are prioritized-list requests.
    error = await denied(kube, f"{RESOURCE}/namespaces/{stranger}/resourceclaimtemplates", {
        "metadata": {"name": "sneaky"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "firstAvailable": [
            {"name": "other", "deviceClassName": "does-not-exist"}, {"name": "ours", "deviceClassName": klass},
        ]}]}}},
    })
    assert f"ResourceClaimTemplate sneaky: namespace {stranger} is not a tenant" in error.message


async def test_admin_access_only_from_the_policys_admin_namespaces(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
    namespaces: Callable[..., Awaitable[str]],
) -> None:
    tenant, ops, other_ops = await namespaces("tenant"), await namespaces("ops"), await namespaces("other-ops")
    # other-ops is a tenant of the first policy, and an admin namespace only of a second one (so it has the label).
    name = await ready_policy(kube, make_policy, {"tenants": [{"namespace": tenant}, {"namespace": other_ops}],
                                                  "adminAccess": {"namespaces": [ops]}})
    await ready_policy(kube, make_policy, {"tenants": [], "adminAccess": {"namespaces": [other_ops]}}, suffix="-b")
    klass = f"{name}.gpuslice.dev"

    async def labelled(ns: str) -> bool:
        return (await kube.get(f"/api/v1/namespaces/{ns}"))["metadata"].get("labels", {}).get(ADMIN_LABEL) == "true"

    await wait_for(lambda: labelled(ops), what="admin label on ops")
    await wait_for(lambda: labelled(other_ops), what="admin label on other-ops")

    allowed = await create_eventually(kube, f"{RESOURCE}/namespaces/{ops}/resourceclaims", claim("monitor", klass, admin=True))
    assert allowed["spec"]["devices"]["requests"][0]["exactly"]["adminAccess"] is True

    error = await denied(kube, f"{RESOURCE}/namespaces/{other_ops}/resourceclaims", claim("monitor", klass, admin=True))
    assert f"namespace {other_ops} may not request adminAccess to devices of GpuSlicePolicy {name}" in error.message

    # In a tenant namespace without the label, the apiserver itself refuses adminAccess.
    with pytest.raises(KubeError) as refused:
        await kube.create(f"{RESOURCE}/namespaces/{tenant}/resourceclaims", claim("monitor", klass, admin=True))
    assert refused.value.status == 422


async def test_only_the_controller_may_set_the_admin_access_label(
    kube: KubeClient, controller: ControllerProcess, namespaces: Callable[..., Awaitable[str]],
) -> None:
    ns = await namespaces("self-granted")
    with pytest.raises(KubeError) as refused:
        await kube.merge_patch(f"/api/v1/namespaces/{ns}", {"metadata": {"labels": {ADMIN_LABEL: "true"}}})
    assert refused.value.status in (403, 422)
    assert f"namespace {ns}: only the gpuslice controller may set {ADMIN_LABEL}=true" in refused.value.message
    with pytest.raises(KubeError, match="only the gpuslice controller"):
        await kube.create("/api/v1/namespaces", {"metadata": {"name": f"{ns}-new", "labels": {ADMIN_LABEL: "true"}}})
    # Other labels stay free to set.
    await kube.merge_patch(f"/api/v1/namespaces/{ns}", {"metadata": {"labels": {"team": "a"}}})


async def test_quota_rejects_the_claim_beyond_max_slices(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
    namespaces: Callable[..., Awaitable[str]],
) -> None:
    tenant = await namespaces("quota")
    name = await ready_policy(kube, make_policy, {"tenants": [{"namespace": tenant, "maxSlices": 2}]})
    klass = f"{name}.gpuslice.dev"
    await wait_for(lambda: get_or_none(kube, f"/api/v1/namespaces/{tenant}/resourcequotas/gpuslice-{name}"), what="quota")

    async def quota_counted() -> bool:
        quota = await kube.get(f"/api/v1/namespaces/{tenant}/resourcequotas/gpuslice-{name}")
        return "used" in (quota.get("status") or {})

    await wait_for(quota_counted, what="the quota controller to count usage")
    for i in range(2):
        await create_eventually(kube, f"{RESOURCE}/namespaces/{tenant}/resourceclaims", claim(f"c{i}", klass))
    with pytest.raises(KubeError) as refused:
        await kube.create(f"{RESOURCE}/namespaces/{tenant}/resourceclaims", claim("c2", klass))
    assert refused.value.status == 403
    assert "exceeded quota" in refused.value.message
    assert f"{klass}.deviceclass.resource.k8s.io/devices" in refused.value.message


async def test_label_set_before_gpuslice_is_left_alone(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
    namespaces: Callable[..., Awaitable[str]],
) -> None:
    """A namespace that had the label before (set while the guard was not installed)."""
    path = f"{VAP}/validatingadmissionpolicybindings/{ADMIN_LABEL_GUARD}"
    await kube.delete(path)
    try:
        async def labelled_namespace() -> str | None:
            try:
                return await namespaces("preexisting", labels={ADMIN_LABEL: "true"})
            except KubeError:
                return None  # the deleted binding may take a moment to stop applying

        ns = await wait_for(labelled_namespace, what="a namespace created with the label")
    finally:
        await kube.apply(path, binding(ADMIN_LABEL_GUARD), field_manager="gpuslice-tests")
        await admin_label_guarded(kube)

    name = await ready_policy(kube, make_policy, {"adminAccess": {"namespaces": [ns]}})
    policy_path = f"/apis/gpuslice.dev/v1alpha1/gpuslicepolicies/{name}"
    await kube.merge_patch(policy_path, {"spec": {"adminAccess": {"namespaces": []}}})

    async def reconciled() -> bool:
        body = await kube.get(policy_path)
        return (body.get("status") or {}).get("observedGeneration") == body["metadata"]["generation"]

    await wait_for(reconciled, what="the edit to be reconciled")
    labels = (await kube.get(f"/api/v1/namespaces/{ns}"))["metadata"]["labels"]
    assert labels.get(ADMIN_LABEL) == "true", "a label gpuslice did not set is never removed"


def tolerating(name: str, device_class: str, *tolerations: dict[str, Any], first_available: bool = False
               ) -> dict[str, Any]:
    body = claim(name, device_class)
    request = body["spec"]["devices"]["requests"][0]
    request["exactly"]["tolerations"] = list(tolerations)
    if first_available:
        request["firstAvailable"] = [{"name": "any", **request.pop("exactly")}]
    return body


async def test_tenants_may_not_tolerate_gpuslices_taints(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
    namespaces: Callable[..., Awaitable[str]],
) -> None:
    """A claim that tolerates gpuslice.dev/pending-change (or everything) would land on devices held
    for a change or draining: refused, as are the policy's own taints unless tolerable."""
    tenant = await namespaces("tolerant")
    name = await ready_policy(kube, make_policy, {"tenants": [{"namespace": tenant}], "taints": [
        {"key": "example.com/maintenance", "effect": "NoSchedule"},
        {"key": "gpuslice.dev/maintenance", "effect": "NoExecute", "tolerable": True}]})
    klass, claims = f"{name}.gpuslice.dev", f"{RESOURCE}/namespaces/{tenant}/resourceclaims"
    refused = [
        {"key": "gpuslice.dev/pending-change", "operator": "Exists", "effect": "NoSchedule"},
        {"operator": "Exists"},
        {"key": "gpuslice.dev/unhealthy", "operator": "Equal", "value": "x"},
        {"key": "gpuslice.dev/anything-new", "operator": "Exists"},
        {"key": "example.com/maintenance", "operator": "Exists"},
    ]
    for i, toleration in enumerate(refused):
        error = await denied(kube, claims, tolerating(f"t{i}", klass, toleration))
        assert f"a request for devices of GpuSlicePolicy {name} tolerates a taint that tenants may not" in error.message
        assert "remove that toleration" in error.message
    error = await denied(kube, claims, tolerating("nested", klass, {"operator": "Exists"}, first_available=True))
    assert "tolerates a taint that tenants may not" in error.message
    # A tolerable policy taint, another driver's taint, and a taint effect the policy's taint does not have.
    for i, toleration in enumerate([{"key": "gpuslice.dev/maintenance", "operator": "Exists"},
                                    {"key": "example.com/other", "operator": "Exists"},
                                    {"key": "example.com/maintenance", "operator": "Exists", "effect": "NoExecute"}]):
        await create_eventually(kube, claims, tolerating(f"ok{i}", klass, toleration))


async def test_admin_namespaces_claim_only_with_admin_access(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
    namespaces: Callable[..., Awaitable[str]],
) -> None:
    """An admin namespace that is not a tenant could otherwise hold devices with no quota at all."""
    ops = await namespaces("ops-only")
    name = await ready_policy(kube, make_policy, {"adminAccess": {"namespaces": [ops]}})
    error = await denied(kube, f"{RESOURCE}/namespaces/{ops}/resourceclaims", claim("plain", f"{name}.gpuslice.dev"))
    assert f"namespace {ops} may use devices of GpuSlicePolicy {name} only with adminAccess: true" in error.message


async def test_a_removed_tenants_claim_is_released_and_its_namespace_deleted(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
    namespaces: Callable[..., Awaitable[str]],
) -> None:
    """kube-controller-manager removes the claim's finalizer with an update: a rule on claim updates
    would keep the claim (and so its namespace) Terminating forever once the tenant is removed."""
    tenant, other = await namespaces("leaving"), await namespaces("staying")
    name = await ready_policy(kube, make_policy, {"tenants": [{"namespace": tenant}, {"namespace": other}]})
    body = claim("kept", f"{name}.gpuslice.dev")
    body["metadata"]["finalizers"] = ["resource.kubernetes.io/delete-protection"]
    path = f"{RESOURCE}/namespaces/{tenant}/resourceclaims"
    await create_eventually(kube, path, body)
    policy_path = f"/apis/gpuslice.dev/v1alpha1/gpuslicepolicies/{name}"
    await kube.merge_patch(policy_path, {"spec": {"tenants": [{"namespace": other}]}})
    await valid(kube, name)
    # A metadata edit of the claim passes: its spec (what it asks for) cannot change.
    await kube.merge_patch(f"{path}/kept", {"metadata": {"labels": {"audit": "done"}}})
    await kube.delete(f"{path}/kept")
    await wait_for(lambda: _gone(kube, f"{path}/kept"), within=30, what="the removed tenant's claim to be deleted")
    await kube.delete(f"/api/v1/namespaces/{tenant}")
    await wait_for(lambda: _gone(kube, f"/api/v1/namespaces/{tenant}"), within=60, what="the namespace to be deleted")


async def _gone(kube: KubeClient, path: str) -> bool:
    return await get_or_none(kube, path) is None


async def test_a_new_tenants_claims_wait_for_its_quota(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, unique: str,
) -> None:
    """A tenant namespace made after the policy names it is admitted only once its quota exists:
    claims rushed in before the quota would never be counted against maxSlices."""
    late = f"rush-{unique}"
    name = await ready_policy(kube, make_policy, {"tenants": [{"namespace": late, "maxSlices": 1}]})
    klass, path = f"{name}.gpuslice.dev", f"{RESOURCE}/namespaces/{late}/resourceclaims"
    made: list[str] = []
    refusals: set[str] = set()

    async def rush() -> bool:
        i = len(made) + len(refusals)
        try:
            await kube.create(path, claim(f"c{i}", klass))
            made.append(f"c{i}")
        except KubeError as error:
            refusals.add(error.message.split(": ", 2)[-1][:80])
        quota = await get_or_none(kube, f"/api/v1/namespaces/{late}/resourcequotas/gpuslice-{name}")
        return bool(made) and quota is not None and "used" in (quota.get("status") or {})

    # The controller is frozen while the namespace appears (as a slow controller would be): claims
    # rushed in then must wait for the quota. Made here, not by the fixture (which waits for the
    # default ServiceAccount), so the claims start at once.
    controller.pause()
    try:
        await kube.create("/api/v1/namespaces", {"metadata": {"name": late}})
        for _ in range(100):
            await rush()
    finally:
        controller.resume()
    try:
        await wait_for(rush, within=30, every=0.01, what="a claim and the quota to count it")
        for _ in range(20):  # the namespace is admitted and counted now: more claims are refused by quota
            await rush()
    finally:
        await delete_namespace(kube, late)
    assert len(made) == 1, f"claims made before the quota counted them: {made}; refusals: {refusals}"


async def test_a_stolen_agent_token_lures_no_tenant_onto_its_node_and_holds_no_policy_hostage(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, gpu_node: GpuNodeFactory,
    namespace: str,
) -> None:
    """H4 of the December hostile review: an agent may publish only its own node's pool, but any
    policy's devices in it. A rogue agent published a device of a policy that selects no node; the
    policy's tenant pod was scheduled onto the rogue node, and the fake device held the policy's
    deletion for good. Now the policy records the nodes it selects, the tenancy rule allocates its
    devices nowhere else, and the controller reports the rogue node and does not wait for it."""
    rogue = await gpu_node("l4", 1)
    await rogue.agent.stop()  # its token is stolen
    name = (await make_policy({"nodeSelector": NO_NODES, "slicing": {"mode": "memory", "sliceSize": "10G"},
                               "tenants": [{"namespace": namespace}]}))["metadata"]["name"]
    body = await valid(kube, name)
    assert body["status"]["selectedNodes"] == []
    lure = {"name": "lure-0", "attributes": {"gpuslice.dev/policy": {"string": name},
                                             "gpuslice.dev/mode": {"string": "memory"},
                                             "gpuslice.dev/sliceSize": {"string": "10G"}},
            "capacity": {"memory": {"value": "10G"}}}
    lure_slice = f"{RESOURCE}/resourceslices/gpuslice-{rogue.name}-devices-00"
    async with await KubeClient.from_kubeconfig(rogue.kubeconfig) as as_rogue:
        await as_rogue.create(f"{RESOURCE}/resourceslices", {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"gpuslice-{rogue.name}-devices-00"},
            "spec": {"driver": "gpu.gpuslice.dev", "nodeName": rogue.name, "devices": [lure],
                     "pool": {"name": rogue.name, "generation": 1, "resourceSliceCount": 1}}})
    try:
        await wait_for(lambda: get_or_none(kube, f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates/gpu-slice"),
                       what="the tenant's claim template")
        await kube.create(f"/api/v1/namespaces/{namespace}/pods", pod_with_claim("victim", "gpu-slice"))
        events = await scheduling_events(kube, namespace, "victim", "does not select (status.selectedNodes)")
        message = next(e["message"] for e in events if "status.selectedNodes" in e["message"])
        assert f"devices {rogue.name}/lure-0 of GpuSlicePolicy {name} are on nodes that policy does not select" in message
        claim = await pod_claim(kube, namespace, "victim")
        assert not ((claim or {}).get("status") or {}).get("allocation"), "never allocated"
        pod = await kube.get(f"/api/v1/namespaces/{namespace}/pods/victim")
        assert not pod["spec"].get("nodeName"), "never scheduled onto the rogue node"

        async def degraded() -> dict[str, Any] | None:
            found = condition(await kube.get(f"/apis/gpuslice.dev/v1alpha1/gpuslicepolicies/{name}"), "Degraded")
            return found if found.get("reason") == "DevicesOnUnselectedNodes" else None

        reported = await wait_for(degraded, within=30, what="the rogue node to be reported")
        assert f"publish devices of it: {rogue.name}." in reported["message"]
        # Its deletion does not wait for the lure: the rogue node holds no policy hostage.
        await kube.delete(f"/api/v1/namespaces/{namespace}/pods/victim", gracePeriodSeconds=0)
        await kube.delete(f"/apis/gpuslice.dev/v1alpha1/gpuslicepolicies/{name}")

        async def gone() -> bool:
            return await get_or_none(kube, f"/apis/gpuslice.dev/v1alpha1/gpuslicepolicies/{name}") is None

        await wait_for(gone, within=30, what="the policy to go though the rogue node still publishes its device")
    finally:
        with contextlib.suppress(KubeError):
            await kube.delete(lure_slice)
