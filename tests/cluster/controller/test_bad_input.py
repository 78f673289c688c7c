"""Input the CRD accepts but the cluster cannot serve: reported with the reason, and tried again
with a bounded backoff (never a reconcile a second), changing nothing already published."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from gpuslice.devcluster.nodes import fake_gpu_node
from gpuslice.kube.client import Invalid, KubeClient, KubeError
from tests.cluster.kubeutil import (
    NO_NODES,
    POLICIES,
    RESOURCE,
    ClusterObjects,
    claim_template,
    condition,
    device_class,
    get_or_none,
    wait_for,
)
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory
from tests.cluster.tenancy import valid_condition


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
    await asyncio.sleep(20)  # length: the window the retries are counted over
    still = await kube.get(f"{RESOURCE}/namespaces/{squatter}/resourceclaimtemplates/gpu-slice")
    assert still["metadata"]["resourceVersion"] == theirs["metadata"]["resourceVersion"]
    # Backoff 2, 4, 8, 16 s: at most five tries in the first 20-odd seconds (every 2 s would be ten or more).
    assert 1 <= failed_reconciles(controller, name) <= 5, failed_reconciles(controller, name)


MEMORY = {"mode": "memory", "sliceSize": "10G"}
MIG = {"mode": "mig", "mig": {"profiles": ["1g.10gb"]}}
INT64_MAX = 2**63 - 1


def _spec(slicing: dict[str, Any], tenant: dict[str, Any] | None = None, **more: Any) -> dict[str, Any]:
    return {"nodeSelector": NO_NODES, "slicing": slicing, "tenants": [{"namespace": "team-x", **(tenant or {})}],
            **more}


# Every number of the spec past its bounds: refused when the policy is written, with the field and the
# bound (the schema's words, or the rule's). The December review's 10^10 slices passed and overflowed
# status.tenants[].limitBytes (int64), and the policy never got a verdict.
OUT_OF_BOUNDS: dict[str, tuple[dict[str, Any], str]] = {
    "maxSlices 10^10": (_spec(MEMORY, {"maxSlices": 10**10}),
                        "spec.tenants[0].maxSlices: Invalid value: 10000000000: spec.tenants[0].maxSlices in body"
                        " should be less than or equal to 1000000"),
    "maxSlices one past": (_spec(MEMORY, {"maxSlices": 1_000_001}), "should be less than or equal to 1000000"),
    "maxSlices negative": (_spec(MEMORY, {"maxSlices": -1}),
                           "spec.tenants[0].maxSlices in body should be greater than or equal to 0"),
    "maxSlices past int64": (_spec(MEMORY, {"maxSlices": 2**64}), "spec.tenants[0].maxSlices"),
    "maxFullGpus one past": (_spec({**MEMORY, "allowFullGpu": True}, {"maxFullGpus": 1_000_001}),
                             "spec.tenants[0].maxFullGpus in body should be less than or equal to 1000000"),
    "maxFullGpus negative": (_spec({**MEMORY, "allowFullGpu": True}, {"maxFullGpus": -1}),
                             "spec.tenants[0].maxFullGpus in body should be greater than or equal to 0"),
    "maxMigDevices one past": (_spec(MIG, {"maxMigDevices": {"1g.10gb": 1_000_001}}),
                               "spec.tenants[0].maxMigDevices.1g.10gb in body should be less than or equal to"
                               " 1000000"),
    "maxMigDevices negative": (_spec(MIG, {"maxMigDevices": {"1g.10gb": -1}}),
                               "should be greater than or equal to 0"),
    "mig layout of 8": (_spec({"mode": "mig", "mig": {"layout": {"1g.10gb": 8}}}),
                        "slicing.mig.layout maps MIG profile names such as 1g.10gb to a count from 1 to 7"),
    "mig layout of 0": (_spec({"mode": "mig", "mig": {"layout": {"1g.10gb": 0}}}), "a count from 1 to 7"),
    "sliceSize past 16Ti": (_spec({"mode": "memory", "sliceSize": "17Ti"}),
                            "slicing.sliceSize must be at most 16Ti: no GPU has more memory"),
    "sliceSize of an exabyte": (_spec({"mode": "shared", "sliceSize": "1E"}), "slicing.sliceSize must be at most 16Ti"),
    "sliceSize of zero": (_spec({"mode": "memory", "sliceSize": "0"}), "slicing.sliceSize must be a positive quantity"),
    "sliceSize below 256Mi": (_spec({"mode": "memory", "sliceSize": "255Mi"}), "slicing.sliceSize must be at least 256Mi"),
    "minMemory past 16Ti": (_spec(MEMORY, gpuSelector={"minMemory": "100Pi"}),
                            "gpuSelector.minMemory must be at most 16Ti: no GPU has more memory"),
    "minMemory negative": (_spec(MEMORY, gpuSelector={"minMemory": "-1"}),
                           "gpuSelector.minMemory must be a positive quantity"),
}


@pytest.mark.parametrize("case", sorted(OUT_OF_BOUNDS))
async def test_every_number_of_the_spec_past_its_bounds_is_refused_with_the_field(
    kube: KubeClient, policy_crd: str, unique: str, case: str,
) -> None:
    spec, message = OUT_OF_BOUNDS[case]
    body = {"apiVersion": "gpuslice.dev/v1alpha1", "kind": "GpuSlicePolicy", "metadata": {"name": f"n-{unique}"},
            "spec": spec}
    with pytest.raises(Invalid) as refused:
        await kube.create(policy_crd, body)
    assert message in refused.value.message


async def test_every_number_of_the_spec_at_its_bounds_gets_a_verdict(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
) -> None:
    """At the bounds nothing the controller computes overflows what the API server stores: a limit
    of a million 16Ti slices is 2^64 bytes and more, reported saturated at 2^63-1."""
    largest = await make_policy(_spec({"mode": "memory", "sliceSize": "16Ti", "allowFullGpu": True},
                                      {"maxSlices": 1_000_000, "maxFullGpus": 1_000_000},
                                      gpuSelector={"minMemory": "16Ti"}), "-max")
    smallest = await make_policy(_spec({"mode": "memory", "sliceSize": "256Mi", "allowFullGpu": True},
                                       {"maxSlices": 0, "maxFullGpus": 0}), "-min")
    mig = await make_policy(_spec({"mode": "mig", "mig": {"profiles": ["1g.10gb", "7g.80gb"]}},
                                  {"maxMigDevices": {"1g.10gb": 1_000_000, "7g.80gb": 0}}), "-mig")
    layout = await make_policy(_spec({"mode": "mig", "mig": {"layout": {"1g.10gb": 7}}}), "-layout")
    for body in (largest, smallest, mig, layout):
        judged = await _judged(kube, body["metadata"]["name"])
        assert condition(judged, "Valid")["status"] in ("True", "False")
    [tenant] = (await kube.get(f"{POLICIES}/{largest['metadata']['name']}"))["status"]["tenants"]
    assert tenant["limitBytes"] == INT64_MAX, "saturated, not overflowed"
    assert tenant["limit"] == 2_000_000
    [tenant] = (await kube.get(f"{POLICIES}/{smallest['metadata']['name']}"))["status"]["tenants"]
    assert (tenant["limit"], tenant["limitBytes"]) == (0, 0)


async def _judged(kube: KubeClient, name: str) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        body = await kube.get(f"{POLICIES}/{name}")
        fresh = (body.get("status") or {}).get("observedGeneration") == body["metadata"]["generation"]
        return body if fresh and condition(body, "Valid") else None

    found: dict[str, Any] = await wait_for(check, within=60, what=f"a verdict on {name} at its generation")
    return found


async def test_a_status_the_api_server_refuses_is_reported_and_retried_with_a_growing_delay(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, cluster_objects: ClusterObjects,
    unique: str,
) -> None:
    """What the API server refuses in the status the controller worked out (a rule of the cluster's,
    here; before the bounds, a limitBytes past int64): the policy says so in Valid, with the
    server's words, and the controller tries again after 2, 4, 8 ... s, not every 2 s."""
    name, probe = f"p-{unique}", f"probe-{unique}"
    # The rule refuses status.tenants of this policy, and the creation of a probe policy: a dry run of
    # the probe tells when the API server enforces it (it loads a new rule a moment after it is made).
    rule = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": f"test-refuse-status-{unique}"},
            "spec": {"failurePolicy": "Fail",
                     "matchConstraints": {"resourceRules": [
                         {"apiGroups": ["gpuslice.dev"], "apiVersions": ["*"], "operations": ["UPDATE"],
                          "resources": ["gpuslicepolicies/status"]},
                         {"apiGroups": ["gpuslice.dev"], "apiVersions": ["*"], "operations": ["CREATE"],
                          "resources": ["gpuslicepolicies"]}]},
                     "matchConditions": [{"name": "this-policy", "expression": (
                         f"(request.operation == 'UPDATE' && object.metadata.name == '{name}')"
                         f" || (request.operation == 'CREATE' && object.metadata.name == '{probe}')")}],
                     "validations": [{"expression": f"object.metadata.name != '{probe}'",
                                      "message": "test: the probe is refused here"},
                                     {"expression": f"object.metadata.name == '{probe}' || !has(object.status.tenants)",
                                      "message": "test: status.tenants is refused here"}]}}
    binding = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
               "metadata": {"name": f"test-refuse-status-{unique}"},
               "spec": {"policyName": f"test-refuse-status-{unique}", "validationActions": ["Deny"]}}
    await cluster_objects.create("/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies", rule)
    await cluster_objects.create("/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings", binding)

    async def in_force() -> bool:
        try:
            await kube.create(POLICIES, {"apiVersion": "gpuslice.dev/v1alpha1", "kind": "GpuSlicePolicy",
                                         "metadata": {"name": probe}, "spec": _spec(MEMORY, {"maxSlices": 2})},
                              dryRun="All")
        except KubeError as error:
            return "test: the probe is refused here" in error.message
        return False

    await wait_for(in_force, within=30, what="the test's rule refusing the probe policy")
    await make_policy(_spec(MEMORY, {"maxSlices": 2}))

    valid = await valid_condition(kube, name, "False")  # the only status it can write: the condition alone
    assert valid["reason"] == "StatusRefused"
    assert "The API server refused the status gpuslice worked out" in valid["message"]
    assert "test: status.tenants is refused here" in valid["message"]
    await asyncio.sleep(20)  # length: the window the retries are counted over
    # Backoff 2, 4, 8, 16 s: at most five tries in the first 20-odd seconds (every 2 s would be ten or more).
    assert 1 <= failed_reconciles(controller, name) <= 6, failed_reconciles(controller, name)
