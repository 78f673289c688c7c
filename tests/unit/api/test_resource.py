"""A GpuSlicePolicy body becomes a model in one place, and each reader words its problems the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuslice.api.resource import GpuSlicePolicy, ParseProblem, parse_policy, valid_policy
from gpuslice.controller.status_write import parse_problem
from gpuslice.inspect.cluster_plan import edited
from gpuslice.inspect.snapshot import InspectError
from gpuslice.preview import PlanError, load_policies
from tests.builders import policy

# A policy as an agent is served it: of a tenant, for a node, judged valid at its generation.
SERVED: dict[str, Any] = {"generation": 1, "uid": "u-p", "node": "n1", "tenants": ["team-a"], "judged": True}


def broken() -> dict[str, Any]:
    body = policy("p", {"mode": "memory", "sliceSize": "lots"}, **SERVED)
    body["spec"]["tenants"] = "team-a"  # a second wrong field
    return body


def test_a_good_body_parses() -> None:
    parsed = parse_policy(policy("p", {"mode": "memory", "sliceSize": "10Gi"}, **SERVED))
    assert isinstance(parsed, GpuSlicePolicy)
    assert parsed.name == "p"
    assert valid_policy(policy("p", {"mode": "memory", "sliceSize": "10Gi"}, **SERVED)) == parsed


def test_a_broken_body_names_its_fields_in_order() -> None:
    problem = parse_policy(broken())
    assert isinstance(problem, ParseProblem)
    assert valid_policy(broken()) is None
    assert problem.first.startswith("spec.slicing: Value error, slicing.sliceSize must be a positive quantity")
    fields = problem.fields()
    assert fields.startswith(problem.first + "; ")
    assert "spec.tenants: " in fields
    assert problem.fields(1) == problem.first


def test_the_controllers_condition_names_the_object_fields_and_fix() -> None:
    problem = parse_policy(broken())
    assert isinstance(problem, ParseProblem)
    message = parse_problem("p", problem)
    assert message.startswith(f"GpuSlicePolicy p does not parse: {problem.fields(5)}. Fix these fields"
                              " (kubectl edit gsp p);")


def test_plan_and_plan_cluster_name_the_file_or_object_and_every_field(tmp_path: Path) -> None:
    problem = parse_policy(broken())
    assert isinstance(problem, ParseProblem)
    file = tmp_path / "p.yaml"
    file.write_text(yaml.safe_dump(broken()))
    with pytest.raises(PlanError) as planned:
        load_policies([file])
    assert str(planned.value) == f"{file}: GpuSlicePolicy p is invalid: {problem.fields()}"
    with pytest.raises(InspectError) as inspected:
        edited(broken(), None)
    assert str(inspected.value).startswith("GpuSlicePolicy p is invalid: spec.slicing: Value error, slicing.sliceSize")
    assert str(inspected.value).endswith("(the apiserver would refuse it)")
