"""A move someone requested is carried out only once the controller has judged it: the planner's own
move is taken up (phase Tainting, started now, its expiry bounded by --defrag-timeout whatever the
request said); anything else is removed, marked Failed with the reason, told in an Event on the
policy, and sets off no pause for the claim it names. The API server is a fake; the planner reads
the fleet of tests/unit/planning/defrag_state."""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any

import pytest

from gpuslice.api.status import DefragMove, ObjectRef
from gpuslice.controller.defrag import move as defrag_move
from gpuslice.controller.defrag.move import Mover, new_move, stamp
from gpuslice.controller.defrag.read import Reading
from gpuslice.dra.names import CONTROLLER_NAMESPACE
from gpuslice.kube.client import KubeClient
from gpuslice.planning.defrag.model import waiting_pods
from tests import builders
from tests.fakeapi import FakeApi
from tests.unit.planning.defrag_state import Fleet

NOW = datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.UTC)
FAR = NOW + datetime.timedelta(days=365 * 70)


def fleet() -> Fleet:
    made = Fleet()
    for gpu, count in enumerate([1, 2, 2, 2]):
        for _ in range(count):
            made.run(gpu)
    made.wait()
    return made


@dataclass
class World:
    """The fleet the planner reads, and the policy as the fake API server holds it."""

    fleet: Fleet
    api: FakeApi
    policy: dict[str, Any] = field(default_factory=dict)
    reads: int = 0

    def record(self, move: DefragMove) -> None:
        self.policy = {**builders.policy("inference", {"mode": "memory", "sliceSize": "10G"}, generation=1, uid="u-inference",
                                       node=builders.NODE, tenants=[builders.TENANT], judged=True), "status": {
            "defragmentation": {"inFlight": [move.model_dump(by_alias=True, exclude_none=True, mode="json")]}}}
        self.api.put(self.policy, path=f"{builders.POLICIES}/inference")

    def status(self) -> dict[str, Any]:
        return dict((self.api.get(f"{builders.POLICIES}/inference") or {})["status"]["defragmentation"])

    def requested(self, **change: Any) -> DefragMove:
        """The planner's move for the waiting pod, as someone requested it: expiring in 70 years."""
        [plan] = self.fleet.plans()
        assert plan.ready, plan.message
        move = new_move(plan, "gpuslice defrag (mallory)", NOW, 300)
        return move.model_copy(update={"expires": stamp(FAR), "started": stamp(FAR), **change})


@pytest.fixture
def world(api: FakeApi, monkeypatch: pytest.MonkeyPatch) -> World:
    made = World(fleet(), api)

    async def read(kube: KubeClient, policy: str | None = None) -> Reading:
        moves = ((made.policy.get("status") or {}).get("defragmentation") or {}).get("inFlight") or []
        cluster = made.fleet.cluster(in_flight=[DefragMove.model_validate(m) for m in moves])
        return Reading(made.fleet.policies, cluster, waiting_pods(cluster.pods, cluster.claims, made.fleet.policies))

    async def counted(kube: KubeClient, policy: str | None = None, home: str = CONTROLLER_NAMESPACE) -> Reading:
        made.reads += 1
        assert home == CONTROLLER_NAMESPACE, "the controller reads the drain lists in its own namespace"
        return await read(kube, policy)

    monkeypatch.setattr(defrag_move, "read_cluster", counted)
    return made


async def test_the_planners_move_is_taken_up_until_the_controllers_timeout(world: World, kube: KubeClient) -> None:
    move = world.requested()
    world.record(move)
    failed: list[DefragMove] = []
    assert await Mover(kube, 30.0, failed.append, timeout=120.0).step(world.policy, move, NOW) is False
    [taken] = world.status()["inFlight"]
    assert (taken["phase"], taken["started"], taken["expires"]) == ("Tainting", stamp(NOW),
                                                                     stamp(NOW + datetime.timedelta(seconds=120)))
    assert not failed


async def test_a_move_that_evicts_a_pod_for_nothing_is_refused_and_pauses_nothing(
        world: World, api: FakeApi, kube: KubeClient) -> None:
    extra = ObjectRef(namespace="team-a", name="rs-2", uid="uid-rs-2")  # on GPU 1: freeing GPU 0 needs it not
    move = world.requested(evictions=[*world.requested().evictions, extra])
    world.record(move)
    failed: list[DefragMove] = []
    assert await Mover(kube, 30.0, failed.append).step(world.policy, move, NOW) is True
    status = world.status()
    assert not status.get("inFlight")
    assert status["last"]["outcome"] == "Failed"
    assert "requested by gpuslice defrag (mallory) was refused" in status["last"]["message"]
    assert "not team-a/rs-1, team-a/rs-2" in status["last"]["message"]
    assert not failed, "the claim it names is not paused: its writer chose it"
    [event] = api.items("/api/v1/namespaces/default/events")
    assert (event["reason"], event["involvedObject"]["kind"]) == ("DefragmentationRefused", "GpuSlicePolicy")
    assert not api.items("/api/v1/namespaces/team-a/events"), "no Event on a pod its writer named"


async def test_a_move_for_a_claim_no_pod_waits_for_is_refused(world: World, kube: KubeClient) -> None:
    move = world.requested(claim=ObjectRef(namespace="team-a", name="rs-1-gpu", uid="uid-rs-1-gpu"))
    world.record(move)
    assert await Mover(kube, 30.0).step(world.policy, move, NOW) is True
    assert "claim team-a/rs-1-gpu (UID uid-rs-1-gpu) is not an unallocated claim" in world.status()["last"]["message"]


async def test_requests_added_many_at_once_are_judged_on_one_reading(world: World, kube: KubeClient) -> None:
    """16 requests fit in a status: judging each on a reading of its own would be 16 LISTs of every
    claim and slice a second, for whoever holds the defrag role."""
    moves = [world.requested(id=f"d-{i}", claim=ObjectRef(namespace="team-a", name="x", uid=f"u-{i}"))
             for i in range(5)]
    world.record(moves[0])
    mover = Mover(kube, 30.0)
    for move in moves:
        await mover.step(world.policy, move, NOW)
    assert world.reads == 1
