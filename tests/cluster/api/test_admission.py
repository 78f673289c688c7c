"""Each admission-time rule of the committed CRD rejects a bad policy with its message,
and the same rule in the pydantic models rejects it offline with the same words."""

from __future__ import annotations

import copy
from typing import Any

import pydantic
import pytest

from gpuslice.api.policy import GpuSlicePolicySpec
from gpuslice.kube.client import KubeClient, KubeError

GOOD: dict[str, Any] = {
    "slicing": {"mode": "memory", "sliceSize": "10Gi"},
    "tenants": [{"namespace": "team-a", "maxSlices": 4}],
}


def _with(path: str, value: Any) -> dict[str, Any]:
    spec = copy.deepcopy(GOOD)
    *parents, leaf = path.split(".")
    node = spec
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
    return spec


BAD: dict[str, tuple[Any, ...]] = {
    "zero slice size": (_with("slicing.sliceSize", "0"), "slicing.sliceSize must be a positive quantity"),
    "slice size not a quantity": (_with("slicing.sliceSize", "ten gigs"), "slicing.sliceSize must be a positive quantity"),
    "slice size too small": (_with("slicing.sliceSize", "1"), "slicing.sliceSize must be at least 256Mi"),
    "more MIG instances than a GPU holds": (
        _with("slicing", {"mode": "mig", "mig": {"layout": {"1g.10gb": 8}}}), "a count from 1 to 7",
    ),
    "negative min memory": (_with("gpuSelector.minMemory", "-1Gi"), "gpuSelector.minMemory must be a positive quantity"),
    "profiles and layout": (
        _with("slicing", {"mode": "mig", "mig": {"profiles": ["1g.10gb"], "layout": {"1g.10gb": 7}}}),
        "set either profiles (dynamic MIG) or layout (static MIG), not both",
    ),
    "mig without mig settings": (_with("slicing", {"mode": "mig"}), "slicing.mig is required in mig mode"),
    "memory without slice size": (_with("slicing", {"mode": "memory"}), "slicing.sliceSize is required"),
    "mig settings in memory mode": (
        _with("slicing", {"mode": "memory", "sliceSize": "10Gi", "mig": {"profiles": ["1g.10gb"]}}),
        "slicing.mig is only allowed with mode: mig",
    ),
    "slice size in mig mode": (
        _with("slicing", {"mode": "mig", "sliceSize": "10Gi", "mig": {"profiles": ["1g.10gb"]}}),
        "slicing.sliceSize does not apply in mig mode",
    ),
    "full gpu in shared mode": (
        _with("slicing", {"mode": "shared", "sliceSize": "10Gi", "allowFullGpu": True}),
        "slicing.allowFullGpu applies to memory mode only",
    ),
    "MPS isolation in mig mode": (
        _with("slicing", {"mode": "mig", "mig": {"profiles": ["1g.10gb"]}, "isolation": "MPS"}),
        "slicing.isolation: MPS applies to memory and shared mode",
    ),
    "unknown isolation": (_with("slicing.isolation", "HAMi"), "Input should be 'None' or 'MPS'",
                          'Unsupported value: "HAMi"'),
    "unknown overuse action": (_with("onOveruse", "Kill"), "Input should be 'Report' or 'Evict'",
                               'Unsupported value: "Kill"'),
    "bad mig profile name": (
        _with("slicing", {"mode": "mig", "mig": {"profiles": ["big-slice"]}}),
        "must list MIG profile names such as 1g.10gb",
    ),
    # The schema's list-map and set types reject duplicates before any CEL runs.
    "duplicate tenant": (
        _with("tenants", [{"namespace": "team-a"}, {"namespace": "team-a", "maxSlices": 1}]),
        "tenants lists a namespace twice", 'spec.tenants[1]: Duplicate value: {"namespace":"team-a"}',
    ),
    "invalid tenant namespace": (_with("tenants", [{"namespace": "Team_A"}]), "must be a namespace name"),
    "invalid admin namespace": (_with("adminAccess", {"namespaces": ["Ops!"]}), "adminAccess.namespaces must be namespace names"),
    "duplicate admin namespace": (
        _with("adminAccess", {"namespaces": ["ops", "ops"]}), "lists a namespace twice",
        'spec.adminAccess.namespaces[1]: Duplicate value: "ops"',
    ),
    "bad extended resource name": (_with("extendedResourceName", "gpu slice"), "extendedResourceName must look like"),
    # What the apiserver would refuse later, in a DeviceTaintRule or a DeviceClass: refused here, with the fix.
    "taint key not a qualified name": (
        _with("taints", [{"key": "maintenance window", "effect": "NoSchedule"}]), "taints[].key must be a qualified name"),
    "taint key with a bad prefix": (
        _with("taints", [{"key": "Example.com/maint", "effect": "NoSchedule"}]), "taints[].key must be a qualified name"),
    "taint value not a label value": (
        _with("taints", [{"key": "gpuslice.dev/maint", "value": "not ok", "effect": "NoSchedule"}]),
        "taints[].value must be empty or at most 63"),
    "one of gpuslice's own taints": (
        _with("taints", [{"key": "gpuslice.dev/pending-change", "effect": "NoSchedule"}]),
        "taints[].key may not be one of gpuslice's own safety taints"),
    "extended resource in kubernetes.io": (
        _with("extendedResourceName", "kubernetes.io/gpu"), "may not be in the kubernetes.io domain"),
    "extended resource in a kubernetes.io subdomain": (
        _with("extendedResourceName", "nvidia.kubernetes.io/gpu"), "may not be in the kubernetes.io domain"),
    "extended resource with requests. prefix": (
        _with("extendedResourceName", "requests.example.com/gpu"), "may not be in the kubernetes.io domain"),
    "the device plugin's extended resource": (
        _with("extendedResourceName", "nvidia.com/gpu"), "may not be one of NVIDIA's device plugin"),
    "the device plugin's MIG resource": (
        _with("extendedResourceName", "nvidia.com/mig-1g.10gb"), "may not be one of NVIDIA's device plugin"),
    "extended resource domain too long": (
        _with("extendedResourceName", "a" * 245 + "/gpu"), "extendedResourceName must look like"),
    "the controller's namespace as a tenant": (
        _with("tenants", [{"namespace": "gpuslice-system"}]), "gpuslice-system is gpuslice's own namespace"),
    "the controller's namespace for admin access": (
        _with("adminAccess", {"namespaces": ["gpuslice-system"]}), "gpuslice-system is gpuslice's own namespace"),
    "maxSlices in mig mode": (
        _with("slicing", {"mode": "mig", "mig": {"profiles": ["1g.10gb"]}}), "in mig mode, limit tenants per MIG profile"),
    "maxMigDevices in memory mode": (
        _with("tenants", [{"namespace": "team-a", "maxMigDevices": {"1g.10gb": 1}}]),
        "tenants[].maxMigDevices is for mig mode"),
    "maxFullGpus without allowFullGpu": (
        _with("tenants", [{"namespace": "team-a", "maxFullGpus": 1}]), "tenants[].maxFullGpus needs slicing.allowFullGpu"),
    "maxMemory zero": (
        _with("tenants", [{"namespace": "team-a", "maxMemory": "0"}]), "maxMemory must be a positive quantity"),
    "maxMemory over its maximum": (
        _with("tenants", [{"namespace": "team-a", "maxMemory": "2Pi"}]), "maxMemory must be a positive quantity"),
    "maxMemory not a quantity": (
        _with("tenants", [{"namespace": "team-a", "maxMemory": "lots"}]), "maxMemory must be a positive quantity"),
    "topology without whole GPUs": (_with("topology", {"counts": [4]}),
                                    "topology offers claims of several whole GPUs: it needs slicing.mode: memory"),
    "the same alignment twice": (
        {"slicing": {"mode": "memory", "sliceSize": "10Gi", "allowFullGpu": True},
         "topology": {"counts": [4], "alignments": [{"match": ["NVLink", "NUMANode"]}, {"match": ["NUMANode", "NVLink"]}]}},
        "topology.alignments lists the same alignment twice"),
    "an aligned count of one GPU": (
        {"slicing": {"mode": "memory", "sliceSize": "10Gi", "allowFullGpu": True}, "topology": {"counts": [1]}},
        "greater than or equal to 2"),
    "an aligned count twice": (
        {"slicing": {"mode": "memory", "sliceSize": "10Gi", "allowFullGpu": True}, "topology": {"counts": [4, 4]}},
        "topology.counts lists a number twice", "spec.topology.counts[1]: Duplicate value: 4"),
    "an alignment nobody publishes": (
        {"slicing": {"mode": "memory", "sliceSize": "10Gi", "allowFullGpu": True},
         "topology": {"counts": [2], "alignments": [{"match": ["Rack"]}]}},
        "Input should be 'NVLink', 'NUMANode' or 'PCIeRoot'", 'Unsupported value: "Rack"'),
    "maxMigDevices of a profile not offered": (
        {"slicing": {"mode": "mig", "mig": {"profiles": ["1g.10gb"]}},
         "tenants": [{"namespace": "team-a", "maxMigDevices": {"3g.40gb": 1}}]},
        "tenants[].maxMigDevices names a MIG profile the policy does not offer"),
}


# Refused by the CRD's rule (the chart renders it with the install's namespace) and by the
# controller's validation (reason ControllerNamespace), not by the model: `gpuslice plan` offline
# does not know which namespace gpuslice is installed in.
INSTALL_DEPENDENT = {"the controller's namespace as a tenant", "the controller's namespace for admin access"}


@pytest.mark.parametrize("case", sorted(BAD))
async def test_bad_policy_is_rejected_with_its_message(kube: KubeClient, policy_crd: str, unique: str, case: str) -> None:
    spec, message, *admission = BAD[case]
    body = {"apiVersion": "gpuslice.dev/v1alpha1", "kind": "GpuSlicePolicy", "metadata": {"name": f"bad-{unique}"}, "spec": spec}
    with pytest.raises(KubeError) as rejected:
        await kube.create(policy_crd, body)
    assert rejected.value.status == 422, rejected.value
    assert (admission[0] if admission else message) in rejected.value.message

    if case in INSTALL_DEPENDENT:
        GpuSlicePolicySpec.model_validate(spec)  # offline the install's namespace is not known
        return
    with pytest.raises(pydantic.ValidationError) as offline:
        GpuSlicePolicySpec.model_validate(spec)
    assert message in str(offline.value)


async def test_unknown_taint_effect_is_rejected(kube: KubeClient, policy_crd: str, unique: str) -> None:
    spec = _with("taints", [{"key": "gpuslice.dev/maintenance", "effect": "PreferNoSchedule"}])
    body = {"apiVersion": "gpuslice.dev/v1alpha1", "kind": "GpuSlicePolicy", "metadata": {"name": f"bad-{unique}"}, "spec": spec}
    with pytest.raises(KubeError) as rejected:
        await kube.create(policy_crd, body)
    assert 'Unsupported value: "PreferNoSchedule"' in rejected.value.message
    assert '"NoSchedule", "NoExecute", "None"' in rejected.value.message


async def test_long_policy_name_is_rejected(kube: KubeClient, policy_crd: str) -> None:
    body = {"apiVersion": "gpuslice.dev/v1alpha1", "kind": "GpuSlicePolicy", "metadata": {"name": "x" * 60}, "spec": GOOD}
    with pytest.raises(KubeError, match="at most 50 characters"):
        await kube.create(policy_crd, body)


async def test_good_policy_is_accepted_with_defaults(kube: KubeClient, policy_crd: str, unique: str) -> None:
    body = {"apiVersion": "gpuslice.dev/v1alpha1", "kind": "GpuSlicePolicy", "metadata": {"name": f"good-{unique}"}, "spec": GOOD}
    created = await kube.create(policy_crd, body)
    try:
        assert created["spec"]["claimTemplateName"] == "gpu-slice"
        assert created["spec"]["slicing"]["allowFullGpu"] is False
        assert created["spec"]["slicing"]["isolation"] == "None"
        assert created["spec"]["onOveruse"] == "Report"
        assert GpuSlicePolicySpec.model_validate(created["spec"]).slicing.slice_bytes == 10 * 1024**3
    finally:
        await kube.delete(f"{policy_crd}/good-{unique}")


async def test_limits_per_kind_and_tolerable_taints_are_accepted(kube: KubeClient, policy_crd: str, unique: str) -> None:
    specs = {
        "mig": {"slicing": {"mode": "mig", "mig": {"layout": {"3g.40gb": 1, "1g.10gb+me": 1}}},
                "tenants": [{"namespace": "team-a", "maxMigDevices": {"1g.10gb+me": 1, "3g.40gb": 0}}, {"namespace": "b"}]},
        "memory": {"slicing": {"mode": "shared", "sliceSize": "1Gi"},
                   "tenants": [{"namespace": "team-a", "maxMemory": "1Pi"},
                               {"namespace": "b", "maxMemory": "30Gi", "maxSlices": 4}]},
        "mig-memory": {"slicing": {"mode": "mig", "mig": {"profiles": ["1g.10gb"]}},
                       "tenants": [{"namespace": "team-a", "maxMemory": "20Gi", "maxMigDevices": {"1g.10gb": 3}}]},
        "full": {"slicing": {"mode": "memory", "sliceSize": "10Gi", "allowFullGpu": True},
                 "tenants": [{"namespace": "team-a", "maxSlices": 2, "maxFullGpus": 1}],
                 "taints": [{"key": "example.com/maint", "value": "v1.2_x", "effect": "NoExecute", "tolerable": True}],
                 "extendedResourceName": "example.com/gpu"},
    }
    for suffix, spec in specs.items():
        body = {"apiVersion": "gpuslice.dev/v1alpha1", "kind": "GpuSlicePolicy",
                "metadata": {"name": f"good-{unique}-{suffix}"}, "spec": spec}
        try:
            created = await kube.create(policy_crd, body)
            GpuSlicePolicySpec.model_validate(created["spec"])
        finally:
            await kube.delete(f"{policy_crd}/good-{unique}-{suffix}")
