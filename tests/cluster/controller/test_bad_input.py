"""Input the CRD accepts but the cluster cannot serve: reported with the reason, and tried again
with a bounded backoff (never a reconcile a second), changing nothing already published."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from gpuslice.devcluster.nodes import fake_gpu_node
from gpuslice.kube.client import KubeClient
from tests.cluster.conftest import ClusterObjects
from tests.cluster.controller.test_objects import NO_NODES, condition, get_or_none
from tests.cluster.controller.test_validation import valid_condition
from tests.cluster.kubeutil import RESOURCE, claim_template, device_class, wait_for
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory

POLICIES = "/apis/gpuslice.dev/v1alpha1/gpuslicepolicies"


def failed_reconciles(controller: ControllerProcess, policy: str) -> int:
    count = 0
    for line in controller.log_text().splitlines():
        if '"reconcile failed' in line:
            entry = json.loads(line)
            count += entry.get("policy") == policy
    return count


async def test_shared_slice_too_large_for_the_smallest_selected_gpu(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, cluster_objects: ClusterObjects,
    unique: str,
) -> None:
    """Every selected GPU is judged, and a shared device needs room for two steps (the apiserver
    refuses min + step above the capacity): the agent would fail to publish the node's pool."""
    pool = {"gpuslice.dev/test-pool": unique}
    for model in ("h100-80gb", "l4"):
        node = fake_gpu_node(f"t-{unique}-{model}", model, 2)
        node["metadata"]["labels"].update(pool)
        await cluster_objects.create("/api/v1/nodes", node)
    name = (await make_policy({"nodeSelector": {"matchLabels": pool},
                               "slicing": {"mode": "shared", "sliceSize": "16Gi"}}))["metadata"]["name"]
    invalid = await valid_condition(kube, name, "False")
    assert invalid["reason"] == "SliceTooLargeToShare"
    assert f"more than half of NVIDIA L4 on t-{unique}-l4 (23034Mi)" in invalid["message"]
    assert "choose a sliceSize of at most 11517Mi" in invalid["message"]

    await kube.merge_patch(f"{POLICIES}/{name}", {"spec": {"nodeSelector": {"matchLabels": {
        **pool, "gpuslice.dev/fake-gpu-model": "h100-80gb"}}}})
    await valid_condition(kube, name, "True")  # 16Gi twice fits an H100
    await kube.merge_patch(f"{POLICIES}/{name}", {"spec": {"slicing": {"sliceSize": "40Gi"}}})
    assert (await valid_condition(kube, name, "False"))["reason"] == "SliceTooLargeToShare"


async def test_an_extended_resource_another_device_class_serves(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, cluster_objects: ClusterObjects,
    unique: str,
) -> None:
    """Of two classes with one extended resource the scheduler uses only one: the policy would
    silently take (or lose) the other driver's pods."""
    resource = f"example.com/{unique}"
    vendor = device_class(f"vendor-{unique}", "gpu.example.com")
    vendor["spec"]["extendedResourceName"] = resource
    await cluster_objects.create(f"{RESOURCE}/deviceclasses", vendor)
    name = (await make_policy({"nodeSelector": NO_NODES, "slicing": {"mode": "memory", "sliceSize": "10Gi"},
                               "extendedResourceName": resource}))["metadata"]["name"]
    invalid = await valid_condition(kube, name, "False")
    assert invalid["reason"] == "ExtendedResourceConflict"
    assert f"spec.extendedResourceName {resource} is already served by DeviceClass vendor-{unique}" in invalid["message"]
    assert await get_or_none(kube, f"{RESOURCE}/deviceclasses/{name}.gpuslice.dev") is None


async def test_a_template_name_a_tenant_already_uses(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
    namespaces: Callable[..., Awaitable[str]],
) -> None:
    """The tenant's own template is left alone and reported; the other tenants are served; the
    controller tries again with a growing delay, not every second."""
    squatter, other = await namespaces("squat"), await namespaces("served")
    theirs = await kube.create(f"{RESOURCE}/namespaces/{squatter}/resourceclaimtemplates",
                               claim_template("gpu-slice", "their-own.example.com"))
    name = (await make_policy({"nodeSelector": NO_NODES, "slicing": {"mode": "memory", "sliceSize": "10Gi"},
                               "tenants": [{"namespace": squatter}, {"namespace": other}]}))["metadata"]["name"]

    async def reported() -> dict[str, Any] | None:
        body = await kube.get(f"{POLICIES}/{name}")
        return body if condition(body, "Degraded").get("reason") == "NameTaken" else None

    body = await wait_for(reported, what="the taken name to be reported")
    message = condition(body, "Degraded")["message"]
    assert f"ResourceClaimTemplate {squatter}/gpu-slice: made by someone else before gpuslice" in message
    assert "choose another spec.claimTemplateName" in message
    assert condition(body, "Valid")["status"] == "True", "a tenant cannot invalidate the policy for everyone"
    await wait_for(lambda: get_or_none(kube, f"{RESOURCE}/namespaces/{other}/resourceclaimtemplates/gpu-slice"),
                   what="the other tenant's template")
    await asyncio.sleep(20)
    still = await kube.get(f"{RESOURCE}/namespaces/{squatter}/resourceclaimtemplates/gpu-slice")
    assert still["metadata"]["resourceVersion"] == theirs["metadata"]["resourceVersion"]
    # Backoff 2, 4, 8, 16 s: at most five tries in the first 20-odd seconds (every 2 s would be ten or more).
    assert 1 <= failed_reconciles(controller, name) <= 5, failed_reconciles(controller, name)
