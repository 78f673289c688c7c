"""The objects a policy asks for, built without a cluster."""

from __future__ import annotations

from typing import Any

from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.planning.cluster_objects import admin_access_guard, desired_objects


def policy(spec: dict[str, Any], name: str = "team-a") -> GpuSlicePolicy:
    return GpuSlicePolicy.model_validate({
        "metadata": {"name": name, "uid": "u-1", "generation": 3, "creationTimestamp": "2026-11-29T10:00:00Z"},
        "spec": spec,
    })


def kinds(objects: list[dict[str, Any]]) -> list[tuple[str, str | None, str]]:
    return [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objects]


def test_memory_policy_objects_exist_only_in_existing_namespaces() -> None:
    p = policy({"slicing": {"mode": "memory", "sliceSize": "10Gi"},
                "tenants": [{"namespace": "a", "maxSlices": 2}, {"namespace": "missing"}, {"namespace": "b"}]})
    desired = desired_objects(p, {"a", "b", "other"})
    assert kinds(desired.all()) == [
        ("DeviceClass", None, "team-a.gpuslice.dev"),
        ("ValidatingAdmissionPolicy", None, "gpuslice-tenancy-team-a"),
        ("ValidatingAdmissionPolicyBinding", None, "gpuslice-tenancy-team-a"),
        ("ResourceClaimTemplate", "a", "gpu-slice"),
        ("ResourceQuota", "a", "gpuslice-team-a"),
        ("ResourceClaimTemplate", "b", "gpu-slice"),
    ]
    for obj in desired.all():
        assert obj["metadata"]["labels"]["gpuslice.dev/policy"] == "team-a"
        assert obj["metadata"]["ownerReferences"] == [{
            "apiVersion": "gpuslice.dev/v1alpha1", "kind": "GpuSlicePolicy", "name": "team-a", "uid": "u-1",
            "controller": True, "blockOwnerDeletion": True,
        }]
    quota = desired.namespaced[1]
    assert quota["spec"]["hard"] == {"team-a.gpuslice.dev.deviceclass.resource.k8s.io/devices": "2"}


def test_shared_template_requests_the_default_capacity() -> None:
    p = policy({"slicing": {"mode": "shared", "sliceSize": "5Gi"}, "tenants": [{"namespace": "a"}]})
    [template] = desired_objects(p, {"a"}).namespaced
    [request] = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"] == {"deviceClassName": "team-a.gpuslice.dev", "capacity": {"requests": {"memory": "5Gi"}}}


def test_tenancy_policy_lists_tenants_and_admins() -> None:
    p = policy({"slicing": {"mode": "memory", "sliceSize": "10Gi"}, "tenants": [{"namespace": "b"}, {"namespace": "a"}],
                "adminAccess": {"namespaces": ["ops"]}})
    vap = desired_objects(p, set()).cluster[1]
    tenancy, admin = vap["spec"]["validations"]
    assert tenancy["expression"].endswith("request.namespace in ['a', 'b', 'ops']")
    assert admin["expression"].endswith("request.namespace in ['ops']")
    assert "GpuSlicePolicy team-a" in tenancy["messageExpression"]


def test_a_tainted_policy_asks_for_no_taint_rules() -> None:
    """Taints travel on the devices the agents publish (see test_node_pool), not as one
    DeviceTaintRule per device."""
    p = policy({"slicing": {"mode": "memory", "sliceSize": "10Gi"},
                "taints": [{"key": "gpuslice.dev/maintenance", "effect": "NoExecute"}]})
    assert "DeviceTaintRule" not in {o["kind"] for o in desired_objects(p, {"a"}).all()}


def test_extended_resource_name_goes_on_the_device_class() -> None:
    p = policy({"slicing": {"mode": "memory", "sliceSize": "10Gi"}, "extendedResourceName": "example.com/gpu-slice"})
    assert desired_objects(p, set()).cluster[0]["spec"]["extendedResourceName"] == "example.com/gpu-slice"


def test_admin_access_guard_names_the_controller() -> None:
    guard = admin_access_guard("system:serviceaccount:gpuslice-system:gpuslice-controller")
    [rule] = guard["spec"]["validations"]
    assert "request.userInfo.username == 'system:serviceaccount:gpuslice-system:gpuslice-controller'" in rule["expression"]
