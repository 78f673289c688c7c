"""The admin-access label: only the controller sets it, through any path, and only its own
record (in the policy's status, where tenants cannot write) decides where it removes it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from gpuslice.kube.client import KubeClient, KubeError
from tests.cluster.controller.test_tenancy import ADMIN_LABEL, ready_policy, valid
from tests.cluster.kubeutil import wait_for
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory

POLICIES = "/apis/gpuslice.dev/v1alpha1/gpuslicepolicies"


async def label(kube: KubeClient, ns: str) -> str | None:
    return (await kube.get(f"/api/v1/namespaces/{ns}"))["metadata"].get("labels", {}).get(ADMIN_LABEL)


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
