"""Recording a move: by hand (gpuslice defrag --apply) only the move is written, never the Auto
eviction budget, which gpuslice-policy-status keeps the controller's alone; in Auto the move's
evictions are counted against the last hour's first."""

from __future__ import annotations

import datetime

from gpuslice.api.status import DefragMove, ObjectRef
from gpuslice.controller.defrag.move import stamp, start
from gpuslice.kube.client import KubeClient
from tests import builders
from tests.fakeapi import FakeApi

NOW = datetime.datetime(2026, 12, 6, 12, 0, tzinfo=datetime.UTC)
LONG_AGO, RECENT = stamp(NOW - datetime.timedelta(hours=2)), stamp(NOW - datetime.timedelta(minutes=5))


def move(ident: str, gpu: str) -> DefragMove:
    pod = ObjectRef(namespace="team-a", name="big", uid=f"pod-{ident}")
    return DefragMove(id=ident, node="node-1", gpu=gpu, gpu_tag="gpu-12345678", device="d",
                      claim=ObjectRef(namespace="team-a", name="big", uid=f"claim-{ident}"), pod=pod,
                      evictions=[ObjectRef(namespace="team-a", name="web", uid="web-1")],
                      started=stamp(NOW), expires=stamp(NOW + datetime.timedelta(minutes=5)))


def put_policy(api: FakeApi) -> None:
    api.put(builders.policy("p", {"mode": "memory", "sliceSize": "10Gi"}, generation=1, uid="u-p", node=builders.NODE,
                            tenants=[builders.TENANT], status={"defragmentation": {"evictions": [LONG_AGO, RECENT]}}),
            path=f"{builders.POLICIES}/p")


async def test_a_move_recorded_by_hand_leaves_the_eviction_budget_as_it_is(api: FakeApi, kube: KubeClient) -> None:
    put_policy(api)
    assert await start(kube, "p", move("d-1", "GPU-1"), [], now=NOW) is None
    recorded = (api.get(f"{builders.POLICIES}/p") or {})["status"]["defragmentation"]
    assert [m["id"] for m in recorded["inFlight"]] == ["d-1"]
    assert recorded["evictions"] == [LONG_AGO, RECENT], "not even the hour-old one pruned"


async def test_an_auto_move_counts_its_evictions_against_the_hour(api: FakeApi, kube: KubeClient) -> None:
    put_policy(api)
    assert await start(kube, "p", move("d-1", "GPU-1"), [], budget=2, now=NOW) is None
    recorded = (api.get(f"{builders.POLICIES}/p") or {})["status"]["defragmentation"]
    assert recorded["evictions"] == [RECENT, stamp(NOW)]
    refused = await start(kube, "p", move("d-2", "GPU-2"), [], budget=2, now=NOW)
    assert refused is not None
    assert "maxEvictionsPerHour is 2" in refused
