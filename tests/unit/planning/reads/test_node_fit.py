"""Whether a pod may go to a node at all: node selector, required node affinity, tolerations."""

from __future__ import annotations

from typing import Any

from gpuslice.planning.reads.node_fit import NodeFacts, Placement, refusal

GPU_NODE = NodeFacts.from_body({"metadata": {"name": "gpu-1", "labels": {"pool": "gpu", "gen": "9"}},
                                "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"},
                                                    {"key": "soft", "effect": "PreferNoSchedule"}]}})


def affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": list(terms)}}},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}


def term(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"matchExpressions": [{"key": key, "operator": operator, "values": list(values)}]}


def test_required_terms_are_ored_and_their_expressions_anded() -> None:
    fits = [affinity(term("pool", "In", "gpu")), affinity(term("pool", "In", "cpu"), term("gen", "Gt", "8")),
            affinity(term("pool", "NotIn", "cpu")), affinity(term("gen", "Exists")),
            affinity({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-1"]}]})]
    for spec in fits:
        assert refusal(Placement.from_spec(spec), GPU_NODE) is None, spec
    kept = [affinity(term("pool", "In", "cpu")), affinity(term("gen", "Lt", "9")), affinity(term("gen", "DoesNotExist")),
            affinity({"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu"]},
                                           {"key": "gen", "operator": "Gt", "values": ["x"]}]}),
            affinity({}), affinity()]
    for spec in kept:
        assert refusal(Placement.from_spec(spec), GPU_NODE) == "its required node affinity does not match node gpu-1"


def test_a_taint_not_tolerated_keeps_it_off_and_a_cordon_counts_as_one() -> None:
    assert "nvidia.com/gpu:NoSchedule" in str(refusal(Placement(), GPU_NODE))  # PreferNoSchedule is no bar
    assert refusal(Placement(tolerations=({"operator": "Exists"},)), GPU_NODE) is None
    assert refusal(Placement(tolerations=({"key": "nvidia.com/gpu", "effect": "NoExecute", "operator": "Exists"},)),
                   GPU_NODE) is not None  # of another effect
    cordoned = NodeFacts.from_body({"metadata": {"name": "n"}, "spec": {"unschedulable": True}})
    assert "node.kubernetes.io/unschedulable" in str(refusal(Placement(), cordoned))
    valued = NodeFacts("v", {}, ({"key": "team", "value": "a", "effect": "NoExecute"},))
    assert refusal(Placement(tolerations=({"key": "team", "value": "a"},)), valued) is None
    assert refusal(Placement(tolerations=({"key": "team", "value": "b"},)), valued) is not None


def test_the_node_selector_must_match() -> None:
    spec = {"nodeSelector": {"pool": "cpu"}, "tolerations": [{"operator": "Exists"}]}
    assert refusal(Placement.from_spec(spec), GPU_NODE) == "its nodeSelector does not match node gpu-1"
