"""Semantic validation of policies against node inventories."""

from __future__ import annotations

from typing import Any

from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.inventory.nodes import node_gpus
from gpuslice.planning.selection import select
from gpuslice.planning.validation import validate
from tests.builders import policy_model


def fake(node: str, model: str, count: int = 8, **labels: str) -> tuple[dict[str, str], Any]:
    node_labels = {"gpuslice.dev/gpu-backend": "fake", "gpuslice.dev/fake-gpu-model": model,
                   "gpuslice.dev/fake-gpu-count": str(count), "kubernetes.io/hostname": node, **labels}
    gpus = node_gpus(node, node_labels)
    assert gpus is not None
    return node_labels, gpus


INVENTORY = [fake("h100", "h100-80gb"), fake("l4", "l4", 4), fake("a100", "a100-40gb", 2)]


def reasons(p: GpuSlicePolicy, others: list[GpuSlicePolicy] = ()) -> list[str]:  # type: ignore[assignment]
    return [problem.reason for problem in validate(p, select(p, INVENTORY), [(o, select(o, INVENTORY)) for o in others])]


def test_selection_by_node_and_product_and_memory() -> None:
    p = policy_model("p", spec={"slicing": {"mode": "memory", "sliceSize": "10Gi"}, "gpuSelector": {"minMemory": "40Gi"}})
    selection = select(p, INVENTORY)
    assert sorted(selection.nodes) == ["a100", "h100"]
    assert selection.gpu_count == 10
    p = policy_model("p", spec={"slicing": {"mode": "memory", "sliceSize": "10Gi"}, "gpuSelector": {"products": ["NVIDIA L4"]}})
    assert select(p, INVENTORY).nodes == {"l4"}


def test_slice_larger_than_any_selected_gpu() -> None:
    assert reasons(policy_model("p", spec={"slicing": {"mode": "memory", "sliceSize": "90Gi"}})) == ["SliceLargerThanGpu"]
    h100s = {"products": ["NVIDIA H100 80GB HBM3"]}
    assert reasons(policy_model("p", spec={"slicing": {"mode": "memory", "sliceSize": "79Gi"}, "gpuSelector": h100s})) == []
    # Every selected GPU counts, not only the largest: the L4s (22.5 GiB) cannot hold a 30Gi slice.
    [problem] = validate(p := policy_model("p", spec={"slicing": {"mode": "shared", "sliceSize": "30Gi"}}), select(p, INVENTORY), [])
    assert problem.reason == "SliceLargerThanGpu"
    assert "NVIDIA L4 on l4" in problem.message
    assert "minMemory: 30Gi" in problem.message
    nothing = {"matchLabels": {"absent": "x"}}
    assert reasons(policy_model("p", spec={"slicing": {"mode": "memory", "sliceSize": "900Gi"}, "nodeSelector": nothing})) == []


def test_too_many_slices_per_gpu_names_the_smallest_size_that_fits() -> None:
    tiny = policy_model("p", spec={"slicing": {"mode": "memory", "sliceSize": "512Mi"}})
    [problem] = validate(tiny, select(tiny, INVENTORY), [])
    assert problem.reason == "TooManySlices"
    assert "into 159 slices; at most 64 per GPU" in problem.message
    assert "choose a sliceSize of at least 1275Mi" in problem.message
    assert reasons(policy_model("p", spec={"slicing": {"mode": "memory", "sliceSize": "1275Mi"}})) == []
    assert reasons(policy_model("p", spec={"slicing": {"mode": "shared", "sliceSize": "512Mi"}})) == [], "one device per GPU"


def test_mig_profiles_are_checked_per_model() -> None:
    h100 = {"matchLabels": {"kubernetes.io/hostname": "h100"}}
    assert reasons(policy_model("p", spec={"nodeSelector": h100, "slicing": {"mode": "mig", "mig": {"profiles": ["3g.40gb"]}}})) == []
    assert reasons(policy_model("p", spec={"nodeSelector": h100, "slicing": {"mode": "mig", "mig": {"profiles": ["3g.20gb"]}}})) == [
        "UnknownMigProfile"]
    l4 = {"matchLabels": {"kubernetes.io/hostname": "l4"}}
    assert reasons(policy_model("p", spec={"nodeSelector": l4, "slicing": {"mode": "mig", "mig": {"profiles": ["1g.10gb"]}}})) == [
        "GpuNotMigCapable"]


def test_static_layout_must_fit_the_gpu() -> None:
    a100 = {"matchLabels": {"kubernetes.io/hostname": "a100"}}
    fits = {"nodeSelector": a100, "slicing": {"mode": "mig", "mig": {"layout": {"3g.20gb": 1, "1g.5gb": 4}}}}
    assert reasons(policy_model("p", spec=fits)) == []
    too_big = {"nodeSelector": a100, "slicing": {"mode": "mig", "mig": {"layout": {"4g.20gb": 1, "3g.20gb": 2}}}}
    assert reasons(policy_model("p", spec=too_big)) == ["MigLayoutDoesNotFit"]


def test_newer_exclusive_policy_yields_and_memory_policies_share() -> None:
    old = policy_model("old", spec={"slicing": {"mode": "memory", "sliceSize": "10Gi"}}, created="2026-11-29T09:00:00Z")
    shared = policy_model("shared", spec={"slicing": {"mode": "shared", "sliceSize": "10Gi"}})
    memory = policy_model("memory", spec={"slicing": {"mode": "memory", "sliceSize": "20Gi"}})
    assert reasons(shared, [old]) == ["ConflictingPolicy"]
    assert reasons(old, [shared]) == []
    assert reasons(memory, [old]) == []


def test_memory_policies_sharing_gpus_need_one_isolation() -> None:
    old = policy_model("old", spec={"slicing": {"mode": "memory", "sliceSize": "10Gi"}}, created="2026-11-29T09:00:00Z")
    mps = policy_model("mps", spec={"slicing": {"mode": "memory", "sliceSize": "20Gi", "isolation": "MPS"}})
    assert reasons(mps, [old]) == ["ConflictingIsolation"]
    assert reasons(old, [mps]) == [], "the older policy keeps its GPUs"
    elsewhere = policy_model("mps", spec={"slicing": {"mode": "memory", "sliceSize": "20Gi", "isolation": "MPS"},
                               "gpuSelector": {"products": ["NVIDIA L4"]}})
    assert reasons(elsewhere, [old]) == ["ConflictingIsolation"], "the L4s are old's too"
    apart = policy_model("mps", spec={"slicing": {"mode": "memory", "sliceSize": "20Gi", "isolation": "MPS"},
                           "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": "h100"}}})
    mine = policy_model("old", spec={"slicing": {"mode": "memory", "sliceSize": "10Gi"},
                          "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": "l4"}}}, created="2026-11-29T09:00:00Z")
    assert reasons(apart, [mine]) == []


def test_same_second_tie_goes_to_the_policy_already_valid() -> None:
    serving = policy_model("zzz", spec={"slicing": {"mode": "memory", "sliceSize": "10Gi"}}, judged=True)
    newcomer = policy_model("aaa", spec={"slicing": {"mode": "shared", "sliceSize": "10Gi"}})
    assert reasons(newcomer, [serving]) == ["ConflictingPolicy"]
    assert reasons(serving, [newcomer]) == []


def test_claim_template_and_extended_resource_collisions() -> None:
    nothing = {"matchLabels": {"absent": "x"}}
    old = policy_model("old", spec={"nodeSelector": nothing, "slicing": {"mode": "memory", "sliceSize": "10Gi"},
                         "tenants": [{"namespace": "a"}], "extendedResourceName": "example.com/gpu"},
                 created="2026-11-29T09:00:00Z")
    new = policy_model("new", spec={"nodeSelector": nothing, "slicing": {"mode": "memory", "sliceSize": "10Gi"},
                         "tenants": [{"namespace": "a"}], "extendedResourceName": "example.com/gpu"})
    assert reasons(new, [old]) == ["ClaimTemplateConflict", "ExtendedResourceConflict"]


def test_shared_slice_must_leave_room_for_two_on_every_selected_gpu() -> None:
    """The apiserver refuses a shared device whose request policy's min + step passes its capacity."""
    fits_h100_not_l4 = policy_model("p", spec={"slicing": {"mode": "shared", "sliceSize": "20Gi"}})
    [problem] = validate(fits_h100_not_l4, select(fits_h100_not_l4, INVENTORY), [])
    assert problem.reason == "SliceTooLargeToShare"
    assert "more than half of NVIDIA L4 on l4 (23034Mi)" in problem.message
    assert "at most 11517Mi" in problem.message
    h100_only = policy_model("p", spec={"slicing": {"mode": "shared", "sliceSize": "39Gi"}, "nodeSelector": {
        "matchLabels": {"kubernetes.io/hostname": "h100"}}})
    assert reasons(h100_only) == []
    assert reasons(policy_model("p", spec={**h100_only.spec.model_dump(by_alias=True, exclude_none=True),
                                "slicing": {"mode": "shared", "sliceSize": "40Gi"}})) == ["SliceTooLargeToShare"]


def test_a_template_name_of_any_kind_collides() -> None:
    full = policy_model("a", spec={"slicing": {"mode": "memory", "sliceSize": "10Gi", "allowFullGpu": True},
                        "tenants": [{"namespace": "t"}], "claimTemplateName": "gpu"}, created="2026-11-29T09:00:00Z")
    other = policy_model("b", spec={"slicing": {"mode": "memory", "sliceSize": "20Gi"}, "tenants": [{"namespace": "t"}],
                         "claimTemplateName": "gpu-full"})
    assert reasons(other, [full]) == ["ClaimTemplateConflict"]


def test_extended_resource_of_a_foreign_class_and_the_controller_namespace() -> None:
    p = policy_model("p", spec={"slicing": {"mode": "memory", "sliceSize": "10Gi"}, "extendedResourceName": "example.com/gpu"})
    [problem] = validate(p, select(p, INVENTORY), [], foreign_extended={"example.com/gpu": "vendor-gpu"})
    assert problem.reason == "ExtendedResourceConflict"
    assert "already served by DeviceClass vendor-gpu" in problem.message
    q = policy_model("q", spec={"slicing": {"mode": "memory", "sliceSize": "10Gi"}, "tenants": [{"namespace": "ops"}]})
    [problem] = validate(q, select(q, INVENTORY), [], controller_namespace="ops")
    assert problem.reason == "ControllerNamespace"


def test_the_controllers_own_namespace_is_refused_wherever_gpuslice_is_installed() -> None:
    """The model does not know where gpuslice runs (another install names gpuslice-system a tenant
    rightly); the controller refuses its own namespace, as a tenant or as an admin namespace, by name."""
    for home in ("gpuslice-system", "gpu-ops"):
        for spec in ({"tenants": [{"namespace": home}]}, {"adminAccess": {"namespaces": [home]}}):
            p = policy_model("p", spec={"slicing": {"mode": "memory", "sliceSize": "10Gi"}, **spec})
            [problem] = validate(p, select(p, INVENTORY), [], controller_namespace=home)
            assert problem.reason == "ControllerNamespace"
            assert f"namespace {home} is where the gpuslice controller runs" in problem.message
            assert "remove it from spec.tenants and spec.adminAccess.namespaces" in problem.message
    elsewhere = policy_model("p", spec={"slicing": {"mode": "memory", "sliceSize": "10Gi"},
                                        "tenants": [{"namespace": "gpuslice-system"}]})
    assert validate(elsewhere, select(elsewhere, INVENTORY), [], controller_namespace="gpu-ops") == []


def test_a_policy_may_select_at_most_a_thousand_nodes() -> None:
    """Each is named in status.selectedNodes, which every allocation of its devices is checked against."""
    p = policy_model("p", spec={"slicing": {"mode": "memory", "sliceSize": "10Gi"}})
    selection = select(p, INVENTORY)
    assert validate(p, selection, [], selected_nodes=1000) == []
    [problem] = validate(p, selection, [], selected_nodes=1001)
    assert problem.reason == "TooManyNodes"
    assert "matches 1001 GPU nodes; a policy may select at most 1000" in problem.message
    assert "narrow spec.nodeSelector" in problem.message
