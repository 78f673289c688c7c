"""The objects a policy asks for, built without a cluster."""

from __future__ import annotations

from typing import Any

from gpuslice.planning.cluster.cluster_objects import desired_objects
from tests.builders import policy_model


def kinds(objects: list[dict[str, Any]]) -> list[tuple[str, str | None, str]]:
    return [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objects]


def test_memory_policy_objects_exist_only_in_existing_namespaces_quota_first() -> None:
    p = policy_model("team-a", uid="u-1", generation=3, spec={"slicing": {"mode": "memory", "sliceSize": "10Gi"},
                "tenants": [{"namespace": "a", "maxSlices": 2}, {"namespace": "missing"}, {"namespace": "b"}]})
    desired = desired_objects(p, {"a", "b", "other"})
    assert kinds(desired.all()) == [
        ("DeviceClass", None, "team-a.gpuslice.dev"),
        ("ResourceQuota", "a", "gpuslice-team-a"),
        ("ResourceClaimTemplate", "a", "gpu-slice"),
        ("ResourceClaimTemplate", "b", "gpu-slice"),
    ]
    for obj in desired.all():
        assert obj["metadata"]["labels"]["gpuslice.dev/policy"] == "team-a"
        assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "gpuslice"
        assert obj["metadata"]["ownerReferences"] == [{
            "apiVersion": "gpuslice.dev/v1alpha1", "kind": "GpuSlicePolicy", "name": "team-a", "uid": "u-1",
            "controller": True, "blockOwnerDeletion": True,
        }]
    [quota] = desired.quotas
    assert quota["spec"]["hard"] == {"team-a.gpuslice.dev.deviceclass.resource.k8s.io/devices": "2"}


def test_each_kind_has_its_class_and_a_limited_tenant_gets_zero_of_what_it_is_not_granted() -> None:
    p = policy_model("team-a", uid="u-1", generation=3, spec={"slicing": {"mode": "memory", "sliceSize": "10G", "allowFullGpu": True},
                "tenants": [{"namespace": "a", "maxSlices": 8}, {"namespace": "b", "maxSlices": 2, "maxFullGpus": 1},
                            {"namespace": "c"}]})
    desired = desired_objects(p, {"a", "b", "c"})
    slices, full = desired.classes
    assert (slices["metadata"]["name"], full["metadata"]["name"]) == ("team-a.gpuslice.dev", "full.team-a.gpuslice.dev")
    assert slices["spec"]["selectors"][0]["cel"]["expression"] == (
        'device.driver == "gpu.gpuslice.dev" && device.attributes["gpuslice.dev"].?policy.orValue("") == "team-a"'
        ' && device.attributes["gpuslice.dev"].?mode.orValue("") == "memory"'
        ' && device.attributes["gpuslice.dev"].?sliceSize.orValue("") == "10G"')
    assert full["spec"]["selectors"][0]["cel"]["expression"].endswith('.?sliceSize.orValue("") == "full"')
    quotas = {q["metadata"]["namespace"]: q["spec"]["hard"] for q in desired.quotas}
    key = ".deviceclass.resource.k8s.io/devices"
    assert quotas == {
        "a": {f"team-a.gpuslice.dev{key}": "8", f"full.team-a.gpuslice.dev{key}": "0"},
        "b": {f"team-a.gpuslice.dev{key}": "2", f"full.team-a.gpuslice.dev{key}": "1"},
    }
    templates = sorted((t["metadata"]["namespace"], t["metadata"]["name"]) for t in desired.templates)
    assert templates == [("a", "gpu-slice"), ("b", "gpu-slice"), ("b", "gpu-slice-full"),
                         ("c", "gpu-slice"), ("c", "gpu-slice-full")]


def test_mig_has_a_class_per_profile_and_the_template_asks_for_the_smallest_usable() -> None:
    p = policy_model("team-a", uid="u-1", generation=3, spec={"slicing": {"mode": "mig", "mig": {"profiles": ["3g.40gb", "1g.10gb+me", "1g.10gb"]}},
                "tenants": [{"namespace": "a", "maxMigDevices": {"3g.40gb": 2}}, {"namespace": "b"}]})
    desired = desired_objects(p, {"a", "b"})
    assert [c["metadata"]["name"] for c in desired.classes] == [
        "1g.10gb.team-a.gpuslice.dev", "1g.10gb-me.team-a.gpuslice.dev", "3g.40gb.team-a.gpuslice.dev"]
    assert desired.classes[2]["spec"]["selectors"][0]["cel"]["expression"].endswith(
        '.?mode.orValue("") == "mig" && device.attributes["gpuslice.dev"].?profile.orValue("") == "3g.40gb"')
    templates = {(t["metadata"]["namespace"], t["metadata"]["name"]):
                 t["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] for t in desired.templates}
    assert templates[("a", "gpu-slice")] == "3g.40gb.team-a.gpuslice.dev"
    assert ("a", "gpu-slice-1g.10gb") not in templates
    assert templates[("b", "gpu-slice")] == "1g.10gb.team-a.gpuslice.dev"
    assert templates[("b", "gpu-slice-1g.10gb-me")] == "1g.10gb-me.team-a.gpuslice.dev"
    assert templates[("b", "gpu-slice-3g.40gb")] == "3g.40gb.team-a.gpuslice.dev"
    [quota] = desired.quotas
    assert sorted(quota["spec"]["hard"].values()) == ["0", "0", "2"]


def test_shared_template_requests_exactly_one_slice() -> None:
    p = policy_model("team-a", uid="u-1", generation=3, spec={"slicing": {"mode": "shared", "sliceSize": "5Gi"}, "tenants": [{"namespace": "a"}]})
    [template] = desired_objects(p, {"a"}).templates
    [request] = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"] == {"deviceClassName": "team-a.gpuslice.dev", "capacity": {"requests": {"memory": "5Gi"}}}


def test_no_admission_objects_per_policy() -> None:
    p = policy_model("team-a", uid="u-1", generation=3, spec={"slicing": {"mode": "memory", "sliceSize": "10Gi"}, "tenants": [{"namespace": "a"}],
                "adminAccess": {"namespaces": ["ops"]}})
    assert not [o for o in desired_objects(p, {"a"}).all() if o["apiVersion"].startswith("admissionregistration")]


def test_a_tainted_policy_asks_for_no_taint_rules() -> None:
    """Taints travel on the devices the agents publish (see test_node_pool), not as one
    DeviceTaintRule per device."""
    p = policy_model("team-a", uid="u-1", generation=3, spec={"slicing": {"mode": "memory", "sliceSize": "10Gi"},
                "taints": [{"key": "gpuslice.dev/maintenance", "effect": "NoExecute"}]})
    assert "DeviceTaintRule" not in {o["kind"] for o in desired_objects(p, {"a"}).all()}


def test_extended_resource_name_goes_on_the_slice_class_only() -> None:
    p = policy_model("team-a", uid="u-1", generation=3, spec={"slicing": {"mode": "memory", "sliceSize": "10Gi", "allowFullGpu": True},
                "extendedResourceName": "example.com/gpu-slice"})
    slices, full = desired_objects(p, set()).classes
    assert slices["spec"]["extendedResourceName"] == "example.com/gpu-slice"
    assert "extendedResourceName" not in full["spec"]
