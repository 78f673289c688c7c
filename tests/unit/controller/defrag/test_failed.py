"""After a move fails: its evictions are said to have been for nothing (and counted), and Auto
frees no GPU for that claim again for a while. A stub stands for the API server."""

from __future__ import annotations

from typing import Any, cast

from gpuslice.api.status import DefragMove, ObjectRef
from gpuslice.controller.defrag.auto import FAILED_PAUSE, Defragmenter
from gpuslice.controller.defrag.move import AUTO, Mover
from gpuslice.controller.settings import ControllerSettings
from gpuslice.kube.client import KubeClient
from gpuslice.planning.defrag.facts import ClaimFacts, PodFacts
from gpuslice.planning.defrag.model import Waiting


def move(by: str = AUTO, evicted: bool = True) -> DefragMove:
    victims = [ObjectRef(namespace="team-a", name="web-1", uid="u-web-1"),
               ObjectRef(namespace="team-a", name="web-2", uid="u-web-2")]
    return DefragMove(id="d-1", node="n1", gpu="GPU-1", gpu_tag="gpu-1", device="gpu-1-full",
                      claim=ObjectRef(namespace="atk", name="big-gpu", uid="u-claim"),
                      pod=ObjectRef(namespace="atk", name="big", uid="u-big"), evictions=victims,
                      evicted=["u-web-1"] if evicted else [], by=by, started="2026-12-01T00:00:00Z",
                      expires="2026-12-01T00:05:00Z")


class Stub:
    def __init__(self, recorded: DefragMove) -> None:
        self.policy = {"metadata": {"name": "p", "resourceVersion": "1"}, "status": {"defragmentation": {
            "inFlight": [recorded.model_dump(by_alias=True, exclude_none=True, mode="json")]}}}
        self.events: list[dict[str, Any]] = []

    async def get(self, path: str) -> dict[str, Any]:
        return self.policy

    async def merge_patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        self.policy["status"].update(patch["status"])
        return self.policy

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.events.append(body)
        return body


async def test_a_failed_moves_evictions_are_said_to_be_for_nothing_and_counted_against_the_budget() -> None:
    failed: list[DefragMove] = []
    recorded = move()
    stub = Stub(recorded)
    mover = Mover(cast(KubeClient, stub), 30.0, failed.append)
    assert await mover.finish("p", recorded, "Failed", "Timeout", "gave up at 00:05: the claim was not allocated")
    assert [m.claim.uid for m in failed] == ["u-claim"]
    [event] = stub.events
    assert event["reason"] == "DefragmentationFailed"
    assert "The 1 pod evicted for it (team-a/web-1) moved for nothing" in event["message"]
    assert "count against maxEvictionsPerHour of GpuSlicePolicy p" in event["message"]


async def test_a_manual_move_or_one_that_evicted_nothing_says_no_more() -> None:
    for recorded, absent in ((move(by="gpuslice defrag (alice)"), "maxEvictionsPerHour"),
                             (move(evicted=False), "moved for nothing")):
        stub = Stub(recorded)
        assert await Mover(cast(KubeClient, stub), 30.0).finish("p", recorded, "Failed", "Timeout", "gave up")
        assert absent not in stub.events[0]["message"]


def test_auto_pauses_a_claim_after_its_move_failed_on_a_clock_that_started_a_second_ago() -> None:
    now = [1.0]
    defrag = Defragmenter(cast(KubeClient, object()), ControllerSettings(), clock=lambda: now[0])
    waiting = Waiting(PodFacts("atk", "big", "u-big"), ClaimFacts("atk", "big-gpu", "u-claim"), "p", "full",
                      "full.p.gpuslice.dev")
    other = Waiting(PodFacts("atk", "new", "u-new"), ClaimFacts("atk", "new-gpu", "u-other"), "p", "full",
                    "full.p.gpuslice.dev")
    assert defrag._paused(waiting, now[0]) is None  # never failed: not paused, however young the clock
    defrag._failed(move())
    now[0] = 61.0
    assert defrag._paused(waiting, now[0]) == FAILED_PAUSE - 60.0
    assert defrag._paused(other, now[0]) is None  # another claim (a pod made again gets a new one)
    now[0] = 1.0 + FAILED_PAUSE
    assert defrag._paused(waiting, now[0]) is None
