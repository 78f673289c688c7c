"""spec.topology's templates: several whole GPUs that sit together, as a prioritized list of alignments."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest

from gpuslice.api.policy import GpuSlicePolicySpec
from gpuslice.api.status import ClassInForce
from gpuslice.planning.aligned import ALIGNED_LABEL
from gpuslice.planning.cluster.cluster_objects import desired_objects
from gpuslice.planning.kinds import all_template_names
from gpuslice.planning.max_memory import least_asked
from gpuslice.planning.modes import device_kinds
from gpuslice.planning.selection import Selection
from gpuslice.planning.validation import validate
from tests.builders import policy_model

TRAIN = {"slicing": {"mode": "memory", "sliceSize": "20Gi", "allowFullGpu": True}}


def templates(spec: dict[str, Any], namespaces: set[str]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(t["metadata"]["namespace"], t["metadata"]["name"]): t
            for t in desired_objects(policy_model("team-a", uid="u-1", generation=3, spec=spec), namespaces).templates}


def test_one_template_per_count_with_the_alignments_in_order_and_a_constraint_per_attribute() -> None:
    found = templates({**TRAIN, "tenants": [{"namespace": "a"}],
                       "topology": {"counts": [4, 2], "alignments": [{"match": ["NUMANode", "NVLink"]},
                                                                      {"match": ["PCIeRoot"]}, {"match": []}]}},
                      {"a"})
    assert sorted(n for _, n in found) == ["gpu-slice", "gpu-slice-full", "gpu-slice-full-x2", "gpu-slice-full-x4"]
    four = found[("a", "gpu-slice-full-x4")]["spec"]
    assert four["metadata"]["labels"] == {"gpuslice.dev/policy": "team-a", ALIGNED_LABEL: "4"}
    [request] = four["spec"]["devices"]["requests"]
    assert request["name"] == "gpus"
    assert [(w["name"], w["deviceClassName"], w["count"], w["allocationMode"]) for w in request["firstAvailable"]] == [
        ("nvlink-numa", "full.team-a.gpuslice.dev", 4, "ExactCount"),
        ("pcie", "full.team-a.gpuslice.dev", 4, "ExactCount"),
        ("any", "full.team-a.gpuslice.dev", 4, "ExactCount")]
    assert four["spec"]["devices"]["constraints"] == [
        {"requests": ["gpus/nvlink-numa"], "matchAttribute": "gpuslice.dev/nvlinkDomain"},
        {"requests": ["gpus/nvlink-numa"], "matchAttribute": "resource.kubernetes.io/numaNode"},
        {"requests": ["gpus/pcie"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}], "none for any"


def test_the_default_alignments_never_take_gpus_that_share_nothing() -> None:
    spec = GpuSlicePolicySpec.model_validate({**TRAIN, "topology": {"counts": [8]}})
    assert spec.topology is not None
    assert [a.name for a in spec.topology.alignments] == ["nvlink-numa", "nvlink", "pcie", "numa"]


def test_a_tenant_gets_only_the_counts_its_whole_gpu_limit_allows() -> None:
    found = templates({**TRAIN, "topology": {"counts": [2, 4, 8]},
                       "tenants": [{"namespace": "few", "maxFullGpus": 4}, {"namespace": "slices", "maxSlices": 8},
                                   {"namespace": "memory", "maxMemory": "100Gi"}, {"namespace": "any"}]},
                      {"few", "slices", "memory", "any"})
    aligned = sorted(k for k in found if "-x" in k[1])
    assert aligned == [("any", "gpu-slice-full-x2"), ("any", "gpu-slice-full-x4"), ("any", "gpu-slice-full-x8"),
                       ("few", "gpu-slice-full-x2"), ("few", "gpu-slice-full-x4"),
                       ("memory", "gpu-slice-full-x2"), ("memory", "gpu-slice-full-x4"), ("memory", "gpu-slice-full-x8")
                       ], "slices: no whole GPU at all; maxMemory is judged at allocation, on the GPUs picked"


def test_max_memory_counts_an_aligned_claim_as_its_gpus() -> None:
    p = policy_model("team-a", uid="u-1", generation=3,
                     spec={**TRAIN, "tenants": [{"namespace": "a", "maxMemory": "1Ti"}], "topology": {"counts": [4]}})
    template = next(t for t in desired_objects(p, {"a"}).templates if t["metadata"]["name"].endswith("-x4"))
    full = ClassInForce(name="full.team-a.gpuslice.dev", kind="full", shared=False, memory="81559Mi",
                        least_memory="81559Mi")
    assert least_asked(template["spec"]["spec"], "team-a", {full.name: full}) == 4 * 81559 * 1024**2


def test_topology_needs_whole_gpus_and_names_are_kept_from_other_policies() -> None:
    with pytest.raises(pydantic.ValidationError, match="topology offers claims of several whole GPUs"):
        GpuSlicePolicySpec.model_validate({"slicing": {"mode": "shared", "sliceSize": "10Gi"},
                                           "topology": {"counts": [2]}})
    one = policy_model("one", uid="u-1", generation=3,
                       spec={**TRAIN, "tenants": [{"namespace": "a"}], "topology": {"counts": [4]}})
    assert "gpu-slice-full-x4" in all_template_names(one, device_kinds(one, Selection(())))
    other = policy_model("other", {"mode": "memory", "sliceSize": "10Gi"}, "2026-11-30T10:00:00Z", uid="u-2",
                         tenants=["a"], claimTemplateName="gpu-slice-full-x4")
    problems = validate(other, Selection(()), [(one, Selection(()))])
    assert any("gpu-slice-full-x4" in p.message for p in problems), problems
