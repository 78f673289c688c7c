"""What the status records of the nodes a policy selects, and what it says about nodes it does not."""

from __future__ import annotations

from typing import Any

from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.controller.status import Findings, build_status
from gpuslice.planning.reads.usage import Usage
from gpuslice.planning.selection import Problem, Selection
from tests.builders import policy_model


def recorded(nodes: list[str]) -> GpuSlicePolicy:
    """A policy whose status records ``nodes`` as the ones it selects."""
    return policy_model("p", {"mode": "memory", "sliceSize": "10Gi"}, "2026-12-01T00:00:00Z", generation=2,
                        status={"selectedNodes": nodes})


def findings(**more: Any) -> Findings:
    return Findings([], Selection(()), 0, Usage(), **more)


def test_the_record_moves_with_valid_specs_only() -> None:
    status = build_status(recorded(["a"]), findings(selected_nodes=("a", "b")), "now")
    assert status.selected_nodes == ["a", "b"]
    frozen = Findings([Problem("SliceLargerThanGpu", "...")], Selection(()), 0, Usage(), selected_nodes=None)
    assert build_status(recorded(["a"]), frozen, "now").selected_nodes == ["a"], "an invalid spec keeps the record"


def test_devices_on_nodes_the_policy_does_not_select_are_reported() -> None:
    status = build_status(recorded([]), findings(selected_nodes=(), unselected=("rogue",)), "now")
    degraded = next(c for c in status.conditions if c.type == "Degraded")
    assert (degraded.status, degraded.reason) == ("True", "DevicesOnUnselectedNodes")
    assert "publish devices of it: rogue." in degraded.message
    assert "delete their gpuslice ResourceSlices" in degraded.message
