"""What the status records of the nodes a policy selects, and what it says about nodes it does not."""

from __future__ import annotations

from typing import Any

from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.controller.status import Findings, build_status
from gpuslice.planning.reads.usage import Usage
from gpuslice.planning.selection import Problem, Selection


def policy(recorded: list[str]) -> GpuSlicePolicy:
    return GpuSlicePolicy.model_validate({
        "metadata": {"name": "p", "generation": 2, "creationTimestamp": "2026-12-01T00:00:00Z"},
        "spec": {"slicing": {"mode": "memory", "sliceSize": "10Gi"}},
        "status": {"selectedNodes": recorded}})


def findings(**more: Any) -> Findings:
    return Findings([], Selection(()), 0, Usage(), **more)


def test_the_record_moves_with_valid_specs_only() -> None:
    status = build_status(policy(["a"]), findings(selected_nodes=("a", "b")), "now")
    assert status.selected_nodes == ["a", "b"]
    frozen = Findings([Problem("SliceLargerThanGpu", "...")], Selection(()), 0, Usage(), selected_nodes=None)
    assert build_status(policy(["a"]), frozen, "now").selected_nodes == ["a"], "an invalid spec keeps the record"


def test_devices_on_nodes_the_policy_does_not_select_are_reported() -> None:
    status = build_status(policy([]), findings(selected_nodes=(), unselected=("rogue",)), "now")
    degraded = next(c for c in status.conditions if c.type == "Degraded")
    assert (degraded.status, degraded.reason) == ("True", "DevicesOnUnselectedNodes")
    assert "publish devices of it: rogue." in degraded.message
    assert "delete their gpuslice ResourceSlices" in degraded.message
