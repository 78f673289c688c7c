"""A GPU is freed only for a pod kube-scheduler turned away for devices: not for a gated pod, one not
yet tried, or one every node turned away for something else (CPU, say), whatever else would admit it."""

from __future__ import annotations

from typing import Any

import pytest

from gpuslice.planning.reads.scheduler_said import SchedulerSaid
from tests.unit.planning.defrag_state import Fleet

CPU = ("0/3 nodes are available: 3 Insufficient cpu. preemption: 0/3 nodes are available: 3 No preemption"
       " victims found for incoming pod.")
MIXED = ("0/3 nodes are available: 1 cannot allocate all claims, 2 node(s) didn't match Pod's node"
         " affinity/selector. preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling.")
PREEMPTION_ONLY = ("0/3 nodes are available: 3 Insufficient cpu. preemption: 0/3 nodes are available: 3 cannot"
                   " allocate all claims.")


def said(message: str, reason: str = "Unschedulable", gates: tuple[str, ...] = ()) -> SchedulerSaid:
    body: dict[str, Any] = {"spec": {"schedulingGates": [{"name": g} for g in gates]}, "status": {"conditions": [
        {"type": "Ready", "status": "False", "reason": "Unschedulable", "message": "1 cannot allocate all claims"},
        {"type": "PodScheduled", "status": "False", "reason": reason, "message": message}]}}
    return SchedulerSaid.from_body(body)


def test_only_nodes_that_lacked_devices_alone_count() -> None:
    assert said(MIXED).nodes_short_of_devices == 1
    assert said(MIXED).not_for_devices() is None
    assert said(CPU).nodes_short_of_devices == 0
    assert said(PREEMPTION_ONLY).nodes_short_of_devices == 0, "the preemption attempt's counts are not the filters'"
    code, why = said(CPU).not_for_devices() or ("", "")
    assert code == "NotDevices"
    assert "3 Insufficient cpu" in why


@pytest.mark.parametrize(("verdict", "code"), [
    (said("Scheduling is blocked due to non-empty scheduling gates", reason="SchedulingGated"), "Gated"),
    (said("0/1 nodes are available: 1 cannot allocate all claims.", gates=("example.com/hold",)), "Gated"),
    (SchedulerSaid.from_body({"status": {"conditions": [{"type": "PodScheduled", "status": "True"}]}}), "NotTried"),
    (SchedulerSaid.from_body({}), "NotTried"),
    (said("0/1 nodes are available: 1 cannot allocate all claims.", reason="SchedulerError"), "NotTried"),
])
def test_a_gated_pod_or_one_not_turned_away_is_not_for_devices(verdict: SchedulerSaid, code: str) -> None:
    found = verdict.not_for_devices()
    assert found is not None
    assert found[0] == code


def fleet() -> Fleet:
    made = Fleet()
    for gpu in range(4):
        made.run(gpu)
    return made


def test_no_gpu_is_freed_for_a_pod_no_node_has_the_cpu_for_or_a_gated_one() -> None:
    made = fleet()
    made.wait("cpu", said=CPU)
    made.wait("gated", said=None, gates=("example.com/hold",))
    made.wait("new", said=None)
    made.wait("mixed", said=MIXED)
    plans = {p.pod: p for p in made.plans()}
    assert (plans["team-a/cpu"].verdict, plans["team-a/cpu"].reason) == ("Unsupported", "NotDevices")
    assert "Insufficient cpu" in plans["team-a/cpu"].message
    assert (plans["team-a/gated"].verdict, plans["team-a/gated"].reason) == ("Unsupported", "Gated")
    assert "example.com/hold" in plans["team-a/gated"].message
    assert (plans["team-a/new"].verdict, plans["team-a/new"].reason) == ("Unsupported", "NotTried")
    assert plans["team-a/mixed"].ready, "one node lacked only devices: freeing a GPU helps"
