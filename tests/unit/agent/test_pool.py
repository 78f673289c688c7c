"""The publish cycle's three steps (agent.pool.NodePool: read, plan, write) one at a time, against the
fake API server: reading and planning change nothing on the server, the claims are read only when
a published device is to change, the plan is what the API server accepts, and the write puts that
plan, and only it, on the server, recorded on the node before any slice is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuslice.agent.pool import NodePool
from gpuslice.agent.pool_state import PoolState
from gpuslice.agent.published import Published
from gpuslice.kube.client import Forbidden, KubeClient
from tests import builders
from tests.fakeapi import FakeApi
from tests.unit.agent.pool import TEN, TWENTY, Pool, refusing

CLAIMS = "/apis/resource.k8s.io/v1/resourceclaims"


@pytest.fixture
def pool(api: FakeApi, kube: KubeClient, tmp_path: Path) -> Pool:
    return Pool.on(api, kube, tmp_path)


def claim_reads(api: FakeApi, since: int) -> int:
    return len([r for r in api.requests[since:] if r.method == "GET" and r.path == CLAIMS])


# Read

async def test_read_writes_nothing_and_reads_no_claim_while_nothing_published_is_to_change(pool: Pool) -> None:
    pool.set_policy("p", TEN)
    await pool.settle()
    since = len(pool.api.requests)

    observed = await pool.read()

    assert pool.api.writes(since) == []
    assert claim_reads(pool.api, since) == 0, "no published device is to change: the claims are not read"
    assert {d["name"] for d in observed.published} == set(pool.devices())
    assert observed.generation == pool.generation()
    assert [p.name for p in observed.policies.plannable] == ["p"]


async def test_read_reads_the_claims_when_a_published_device_is_to_change(pool: Pool) -> None:
    pool.set_policy("p", TEN)
    await pool.settle()
    taken = sorted(pool.devices())[0]
    pool.allocate("c", taken)
    pool.set_policy("p", TWENTY)
    since = len(pool.api.requests)

    observed = await pool.read()

    assert pool.api.writes(since) == []
    assert claim_reads(pool.api, since) == 1
    assert observed.allocated == {taken}


async def test_read_counts_what_the_kubelet_plugin_prepared_as_allocated(pool: Pool) -> None:
    pool.set_policy("p", TEN)
    await pool.settle()
    prepared = sorted(pool.devices())[1]
    pool.hold(prepared)

    assert (await pool.read()).allocated == {prepared}, "before any claim's status says so"


async def test_read_takes_the_record_for_what_is_published_once_the_kubelet_wiped_the_pool(pool: Pool) -> None:
    pool.set_policy("p", TEN)
    await pool.settle()
    before, generation = pool.devices(), pool.generation()
    for piece in pool.slices():
        pool.api.remove(f"{builders.SLICES}/{piece['metadata']['name']}")

    observed = await pool.read()

    assert observed.existing == []
    assert {d["name"]: d for d in observed.published} == before
    assert observed.generation == generation, "the record's generation: the next write is newer than any seen"


# Plan

async def test_plan_of_a_steady_pool_is_unchanged_and_asks_the_server_nothing(pool: Pool) -> None:
    pool.set_policy("p", TEN)
    await pool.settle()
    observed = await pool.read()
    since = len(pool.api.requests)

    plan = await pool.agent.plan(observed)

    assert plan.unchanged
    assert plan.manifests == {}
    assert pool.api.requests[since:] == [], "no dry run, no read"


async def test_plan_is_the_next_generation_the_server_accepts_in_a_dry_run(pool: Pool) -> None:
    pool.set_policy("p", TEN)
    observed = await pool.read()
    since = len(pool.api.requests)

    plan = await pool.agent.plan(observed)

    assert not plan.unchanged
    assert plan.manifests, "a new policy: its slices"
    assert all(m["spec"]["pool"]["generation"] == observed.generation + 1 for m in plan.manifests.values())
    asked = pool.api.requests[since:]
    assert asked
    assert all(r.dry_run for r in asked), "only dry runs"
    assert pool.slices() == []


async def test_plan_leaves_out_a_policy_the_server_refuses(pool: Pool) -> None:
    pool.set_policy("good", TEN)
    pool.set_policy("bad", TWENTY)
    pool.api.admit(refusing("bad", 422))
    observed = await pool.read()
    since = len(pool.api.requests)

    plan = await pool.agent.plan(observed)

    assert list(plan.refused) == ["bad"]
    policies = {d["attributes"]["gpuslice.dev/policy"]["string"] for m in plan.manifests.values()
                for d in m["spec"].get("devices") or []}
    assert policies == {"good"}
    assert pool.api.writes(since) == [], "refused in dry runs; nothing written"


# Write

async def test_write_puts_the_plan_and_only_it_on_the_server(pool: Pool) -> None:
    pool.set_policy("p", TEN)
    await pool.settle()
    old = {s["metadata"]["name"] for s in pool.slices()}
    pool.set_policy("p", TWENTY)
    observed = await pool.read()
    plan = await pool.agent.plan(observed)

    result = await pool.agent.write(observed, plan)

    assert {s["metadata"]["name"]: s for s in pool.slices()}.keys() == plan.manifests.keys()
    assert set(result.written) == set(plan.manifests)
    assert set(result.deleted) == old - set(plan.manifests)
    assert result.generation == observed.generation + 1
    record = pool.record.load()
    assert record is not None
    assert record.generation == result.generation
    assert sorted(d["name"] for d in record.devices) == sorted(pool.devices())


async def test_write_of_an_unchanged_plan_writes_no_slice_and_records_an_earlier_agents_pool(
        api: FakeApi, kube: KubeClient, tmp_path: Path, pool: Pool) -> None:
    pool.set_policy("p", TEN)
    await pool.settle()
    (tmp_path / "published.json").unlink()  # slices of an earlier agent, whose record this node lacks
    agent = NodePool(builders.NODE, kube, pool.agent.ops, PoolState(record=pool.record))
    pool.controller_views()
    observed = await agent.read()
    plan = await agent.plan(observed)
    since = len(api.requests)

    result = await agent.write(observed, plan)

    assert plan.unchanged
    assert not result.changed
    assert [r for r in api.writes(since) if "resourceslices" in r.path] == []
    assert pool.record.load() == Published(observed.generation, observed.published, observed.counter_sets)


async def test_write_records_the_generation_before_any_slice_of_it_is_written(pool: Pool) -> None:
    pool.set_policy("p", TEN)
    observed = await pool.read()
    plan = await pool.agent.plan(observed)
    pool.api.fail("PATCH", f"{builders.SLICES}/.*", 403, "a rule refuses the write itself", dry_run=False)

    with pytest.raises(Forbidden):
        await pool.agent.write(observed, plan)

    assert pool.slices() == []
    record = pool.record.load()
    assert record is not None, "a claim may get a device as soon as its generation is complete: recorded first"
    assert record.generation == observed.generation + 1
