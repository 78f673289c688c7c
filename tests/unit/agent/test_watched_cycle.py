"""A publish cycle reads what the agent's watches hold (the policies' agent views, its Node, the
slices on it), so one with nothing to change makes no request at all: the agents' resync every
minute cost every node two reads a minute before (its slices and its drain object). The slice
store keeps the agent's own writes as the API server answered them: an older event still on its
way does not undo them, and a slice deleted while the watch was down is gone after its relist."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from gpuslice.agent.watches import AgentView, AgentWatches
from gpuslice.api.agent_view import VIEWS, policy_of
from gpuslice.kube.client import KubeClient
from tests import builders
from tests.fakeapi import FakeApi
from tests.unit.agent.pool import Pool

TEN = {"mode": "memory", "sliceSize": "10G"}


@pytest.fixture
def pool(api: FakeApi, kube: KubeClient, tmp_path: Path) -> Pool:
    return Pool.on(api, kube, tmp_path)


def watched(api: FakeApi) -> AgentView:
    """The agent's view as its three watches list it from ``api``."""
    view = AgentView(node=api.get(f"/api/v1/nodes/{builders.NODE}"))
    view.policies = {v["metadata"]["name"]: policy_of(v) for v in api.items(VIEWS)}
    view.slices = {s["metadata"]["name"]: s for s in api.items(builders.SLICES)
                   if s["spec"].get("nodeName") == builders.NODE}
    for listed in (view.policies_listed, view.node_listed, view.slices_listed):
        listed.set()
    return view


async def test_a_cycle_with_nothing_to_change_makes_no_request(pool: Pool, api: FakeApi) -> None:
    pool.set_policy("p", TEN)
    pool.controller_views()
    view = watched(api)
    async with pool.agent.lock:
        assert (await pool.agent.publish(view)).changed
    assert pool.devices(), "published"
    since = len(api.requests)
    for _ in range(3):  # the resync's cycles, and the one the agent's own write's event wakes
        async with pool.agent.lock:
            assert not (await pool.agent.publish(view)).changed
    assert [str(r) for r in api.requests[since:]] == []


def slice_body(name: str, version: int, generation: int = 1) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": str(version)},
            "spec": {"driver": "gpu.gpuslice.dev", "nodeName": "n1", "pool": {"name": "n1", "generation": generation}}}


async def test_the_slice_store_keeps_the_agents_own_writes_and_forgets_what_went() -> None:
    wake, stop = asyncio.Event(), asyncio.Event()
    watches = AgentWatches(None, "n1", wake, stop)  # type: ignore[arg-type]
    view = watches.view
    watches._slice_event(None, slice_body("n1-a", 10))
    watches._slice_event(None, slice_body("n1-b", 11))
    watches._slices_relisted()
    view.wrote(slice_body("n1-a", 20, generation=2))  # the agent's write, as the API server answered
    watches._slice_event("MODIFIED", slice_body("n1-a", 15))  # an older event, still on its way
    assert view.slices["n1-a"]["metadata"]["resourceVersion"] == "20"
    assert not wake.is_set()
    watches._slice_event("MODIFIED", slice_body("n1-a", 20, generation=2))  # its own write coming back
    assert not wake.is_set(), "the agent's own write wakes no cycle"
    watches._slice_event("MODIFIED", slice_body("n1-a", 30, generation=2))  # someone else changed it
    assert wake.is_set()
    assert view.slices["n1-a"]["metadata"]["resourceVersion"] == "30"
    view.deleted("n1-b")
    watches._slice_event("MODIFIED", slice_body("n1-b", 11))  # from before the delete
    assert "n1-b" not in view.slices
    # The watch broke and listed again: n1-a is gone (the kubelet wiped the pool), so it goes here too.
    watches._slice_event(None, slice_body("n1-c", 40))
    watches._slices_relisted()
    assert set(view.slices) == {"n1-c"}
    await watches.close()
