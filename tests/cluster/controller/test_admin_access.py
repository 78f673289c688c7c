"""The admin-access label: only the controller sets it, through any path, and only its own
record (in the policy's status, where tenants cannot write) decides where it removes it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from gpuslice.kube.client import KubeClient, KubeError
from tests.cluster.gpu_nodes import GpuNodeFactory
from tests.cluster.kubeutil import PAUSE_IMAGE, POLICIES, RESOURCE, get_or_none, wait_for
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory
from tests.cluster.pools import pool_devices, published
from tests.cluster.tenancy import ADMIN_LABEL, ready_policy, valid


async def label(kube: KubeClient, ns: str) -> str | None:
    return (await kube.get(f"/api/v1/namespaces/{ns}"))["metadata"].get("labels", {}).get(ADMIN_LABEL)


async def _labelled(kube: KubeClient, ns: str) -> bool:
    return await label(kube, ns) == "true"


async def test_the_label_cannot_be_set_through_status_or_finalize(
    kube: KubeClient, controller: ControllerProcess, namespaces: Callable[..., Awaitable[str]],
) -> None:
    """The namespace's status and finalize subresources keep the metadata of the request: each
    can set labels, so each is guarded."""
    ns = await namespaces("subresources")
    with pytest.raises(KubeError) as refused:
        await kube.merge_patch(f"/api/v1/namespaces/{ns}/status", {"metadata": {"labels": {ADMIN_LABEL: "true"}}})
    assert f"namespace {ns}: only the gpuslice controller may set {ADMIN_LABEL}=true" in refused.value.message
    body = await kube.get(f"/api/v1/namespaces/{ns}")
    body["metadata"].setdefault("labels", {})[ADMIN_LABEL] = "true"
    with pytest.raises(KubeError) as refused:
        await kube.replace(f"/api/v1/namespaces/{ns}/finalize", body)
    assert "only the gpuslice controller may set" in refused.value.message
    assert await label(kube, ns) is None


async def test_the_label_leaves_with_its_grant_whatever_the_namespace_editors_do(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
    namespaces: Callable[..., Awaitable[str]],
) -> None:
    """Whoever edits the namespace can remove its annotations; ownership is not kept there."""
    ops = await namespaces("ops-edit")
    name = await ready_policy(kube, make_policy, {"adminAccess": {"namespaces": [ops]}})
    await wait_for(lambda: label(kube, ops), what="the admin-access label")
    body = await valid(kube, name)
    assert body["status"]["adminAccessLabels"] == [ops]

    namespace = await kube.get(f"/api/v1/namespaces/{ops}")
    annotations = namespace["metadata"].get("annotations") or {}
    await kube.merge_patch(f"/api/v1/namespaces/{ops}", {"metadata": {"annotations": {
        **dict.fromkeys(annotations), "gpuslice.dev/admin-access-for": None}}})  # a tenant's clean-up

    await kube.merge_patch(f"{POLICIES}/{name}", {"spec": {"adminAccess": {"namespaces": []}}})

    async def removed() -> bool:
        return await label(kube, ops) is None

    await wait_for(removed, what="the label to leave with the grant")
    assert (await valid(kube, name))["status"].get("adminAccessLabels", []) == []


async def test_a_controller_the_guard_does_not_name_refuses_to_start(
    controller: ControllerProcess, kubeconfig: Path, tmp_path: Path,
) -> None:
    """Run as another identity (here the cluster admin), every label it set would be refused:
    it says so and exits instead of failing policy by policy."""
    other = ControllerProcess(kubeconfig, tmp_path / "other.log")
    other.start()
    try:
        async def exited() -> bool:
            assert other.process is not None
            return other.process.poll() is not None

        await wait_for(exited, within=60, what="the misconfigured controller to exit")
    finally:
        await other.stop()
    text = other.log_text()
    assert "the ValidatingAdmissionPolicy gpuslice-admin-access-label does not name this controller's identity" in text
    assert "replace the controller's username in manifests/admission.yaml" in text


async def test_admin_access_holds_back_no_change_and_no_deletion(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, gpu_node: GpuNodeFactory,
    namespaces: Callable[..., Awaitable[str]],
) -> None:
    """T10 of the December hostile review: admin access takes no device from anyone (the scheduler
    counts nothing taken), yet an admin namespace's `allocationMode: All` claim held every change of
    the policy's devices back (pending-change) and its deletion waiting. It holds nothing back now."""
    node = await gpu_node("l4", 1)
    ops = await namespaces("ops")
    name = (await make_policy({"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node.name}},
                               "slicing": {"mode": "memory", "sliceSize": "10G"},
                               "adminAccess": {"namespaces": [ops]}}))["metadata"]["name"]
    before = await published(kube, node.name, 2)
    await wait_for(lambda: _labelled(kube, ops), what="the admin-access label on the admin namespace")
    watch = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "watch"},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                 "deviceClassName": f"{name}.gpuslice.dev", "allocationMode": "All", "adminAccess": True}}]}}}
    await kube.create(f"{RESOURCE}/namespaces/{ops}/resourceclaims", watch)
    await kube.create(f"/api/v1/namespaces/{ops}/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "exporter"},
        "spec": {"containers": [{"name": "c", "image": PAUSE_IMAGE, "resources": {"claims": [{"name": "gpu"}]}}],
                 "resourceClaims": [{"name": "gpu", "resourceClaimName": "watch"}]}})

    async def allocated() -> list[dict[str, Any]] | None:
        claim = await kube.get(f"{RESOURCE}/namespaces/{ops}/resourceclaims/watch")
        return (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results")

    results = await wait_for(allocated, within=60, what="the admin claim to be allocated")
    assert {r["device"] for r in results} == set(before)
    assert all(r.get("adminAccess") for r in results)

    await kube.merge_patch(f"{POLICIES}/{name}", {"spec": {"slicing": {"sliceSize": "5G"}}})

    async def resized() -> dict[str, Any] | None:
        devices = await pool_devices(kube, node.name)
        return devices if set(devices).isdisjoint(before) and len(devices) == 4 else None

    after = await wait_for(resized, within=60, what="the resize to apply though an admin claim has every device")
    assert not any(d.get("taints") for d in after.values()), "nothing held back"
    await kube.delete(f"{POLICIES}/{name}")

    async def gone() -> bool:
        return await get_or_none(kube, f"{POLICIES}/{name}") is None

    await wait_for(gone, within=60, what="the policy to go though the admin claim is still allocated")
    assert await allocated(), "the admin claim itself is left as it was (its namespace owns it)"
