"""What wakes a node agent: only what the planner reads."""

from __future__ import annotations

import copy

from gpuslice.agent.watches import planned_from


def _policy() -> dict:  # type: ignore[type-arg]
    return {"metadata": {"name": "p", "generation": 2, "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"slicing": {"mode": "memory", "sliceSize": "10G"}},
            "status": {"observedGeneration": 2, "slices": {"published": 8, "allocated": 1},
                       "conditions": [{"type": "Valid", "status": "True", "reason": "SpecValid"}]}}


def test_status_counts_wake_no_agent_but_a_verdict_or_a_spec_does() -> None:
    before = _policy()
    counted = copy.deepcopy(before)
    counted["status"]["slices"]["allocated"] = 2
    assert planned_from(counted) == planned_from(before)
    judged = copy.deepcopy(before)
    judged["status"]["conditions"][0]["status"] = "False"
    assert planned_from(judged) != planned_from(before)
    edited = copy.deepcopy(before)
    edited["spec"]["slicing"]["sliceSize"] = "20G"
    assert planned_from(edited) != planned_from(before)
