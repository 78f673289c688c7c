"""The agents' own-node admission rule and the names the planner gives slices agree, and no
node's names are another's: the rule in manifests/agent-rbac.yaml, evaluated here the way its
CEL does (prefix, then the suffix matched exactly)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from hypothesis import given
from hypothesis import strategies as st

from gpuslice.agent.gpus.fake import FakeBackend
from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.dra.resourceslice import slice_name
from gpuslice.planning.node.node_pool import plan_node_pool

MANIFEST = Path(__file__).resolve().parents[3] / "manifests" / "agent-rbac.yaml"


def suffix_pattern() -> str:
    [policy] = [d for d in yaml.safe_load_all(MANIFEST.read_text())
                if d and d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"] == "gpuslice-agent-own-node"]
    [variable] = [v for v in policy["spec"]["variables"] if v["name"] == "nameIsOwn"]
    found = re.search(r"\.matches\('([^']+)'\)", variable["expression"])
    assert found, variable["expression"]
    return found.group(1)


def admitted(node: str, name: str) -> bool:
    prefix = f"gpuslice-{node}-"
    return name.startswith(prefix) and re.search(suffix_pattern(), name[len(prefix):]) is not None


def test_every_slice_the_planner_makes_is_admitted_for_its_node() -> None:
    gpus = FakeBackend("n", [("h100-80gb", 16)]).discover()
    policies = [GpuSlicePolicy.model_validate({"metadata": {"name": f"p{i}", "creationTimestamp": "2026-11-29T10:00:00Z"},
                                               "spec": {"slicing": {"mode": "memory", "sliceSize": "1300Mi"}}})
                for i in range(8)]
    plan = plan_node_pool({}, gpus, policies)
    assert len(plan.slices) > 100, "enough slices for three-digit numbers"
    for planned in plan.slices:
        assert admitted("gpu-node-1", slice_name("gpu-node-1", planned.suffix)), planned.suffix


node_names = st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,30}[a-z0-9])?", fullmatch=True)
suffixes = st.builds(lambda kind, n: f"{kind}-{n:02d}", st.sampled_from(["counters", "devices"]), st.integers(0, 200))


@given(node_names, node_names, suffixes)
def test_no_node_may_take_another_nodes_slice_names(mine: str, other: str, suffix: str) -> None:
    if mine != other:
        assert not admitted(mine, slice_name(other, suffix)), f"{mine} could take {slice_name(other, suffix)}"


def test_the_squatting_example_of_the_issue() -> None:
    assert admitted("a-b", "gpuslice-a-b-devices-00")
    assert not admitted("a", "gpuslice-a-b-devices-00")
    assert not admitted("a", "gpuslice-a-devices-00-x")
