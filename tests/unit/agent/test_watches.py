"""What wakes a node agent: only what the planner reads."""

from __future__ import annotations

import copy

import pytest

from gpuslice.agent.watches import planned_from
from tests.builders import policy

# A judged policy whose status also counts its slices.
BEFORE = policy("p", {"mode": "memory", "sliceSize": "10G"}, "2026-01-01T00:00:00Z", generation=2, judged=True,
                status={"slices": {"published": 8, "allocated": 1}})


def test_status_counts_wake_no_agent_but_a_verdict_or_a_spec_does() -> None:
    before = copy.deepcopy(BEFORE)
    counted = copy.deepcopy(before)
    counted["status"]["slices"]["allocated"] = 2
    assert planned_from(counted) == planned_from(before)
    judged = copy.deepcopy(before)
    judged["status"]["conditions"][0]["status"] = "False"
    assert planned_from(judged) != planned_from(before)
    edited = copy.deepcopy(before)
    edited["spec"]["slicing"]["sliceSize"] = "20G"
    assert planned_from(edited) != planned_from(before)


@pytest.mark.looptime  # the wake comes within the jitter, on fake loop time
@pytest.mark.asyncio(loop_scope="function")  # its own loop: a task another test left on the shared one keeps fake time from jumping
async def test_only_policies_that_select_the_node_wake_its_agent() -> None:
    import asyncio

    from gpuslice.agent.watches import POLICY_JITTER, AgentWatches

    wake, stop = asyncio.Event(), asyncio.Event()
    watches = AgentWatches(None, "n1", wake, stop)  # type: ignore[arg-type]
    watches.view.node = {"metadata": {"name": "n1", "labels": {"pool": "a"}}}
    elsewhere = copy.deepcopy(BEFORE)
    elsewhere["spec"]["nodeSelector"] = {"matchLabels": {"pool": "b"}}
    watches._policy_event("ADDED", elsewhere)
    await asyncio.sleep(POLICY_JITTER)
    assert not wake.is_set()
    moved = copy.deepcopy(elsewhere)
    moved["metadata"]["generation"] = 3
    moved["spec"]["nodeSelector"] = {"matchLabels": {"pool": "a"}}  # now it selects n1
    watches._policy_event("MODIFIED", moved)
    await asyncio.sleep(POLICY_JITTER)
    assert wake.is_set()
    wake.clear()
    away = copy.deepcopy(moved)
    away["metadata"]["generation"] = 4
    away["spec"]["nodeSelector"] = {"matchLabels": {"pool": "b"}}  # leaving n1 changes its pool too
    watches._policy_event("MODIFIED", away)
    await asyncio.sleep(POLICY_JITTER)
    assert wake.is_set()
    await watches.close()


async def test_another_drivers_slices_wake_the_agent_only_when_the_gpus_they_name_change() -> None:
    import asyncio

    from gpuslice.agent.watches import AgentWatches

    wake, stop = asyncio.Event(), asyncio.Event()
    watches = AgentWatches(None, "n1", wake, stop)  # type: ignore[arg-type]

    def other(uuid: str, generation: int) -> dict[str, object]:
        return {"metadata": {"name": "n1-gpu.nvidia.com-x", "resourceVersion": str(generation)},
                "spec": {"driver": "gpu.nvidia.com", "nodeName": "n1", "pool": {"generation": generation},
                         "devices": [{"name": "gpu-0", "attributes": {"uuid": {"string": uuid}}}]}}

    watches._slice_event("ADDED", other("GPU-1", 1))
    assert wake.is_set()
    wake.clear()
    watches._slice_event("MODIFIED", other("GPU-1", 2))
    assert not wake.is_set(), "a new generation naming the same GPUs changes nothing here"
    watches._slice_event("MODIFIED", other("GPU-2", 3))
    assert wake.is_set()
    wake.clear()
    watches._slice_event("DELETED", other("GPU-2", 3))
    assert wake.is_set(), "its GPUs may be published again"
