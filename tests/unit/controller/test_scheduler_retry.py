"""The controller's asks to kube-scheduler (controller.retry): once per interval in all, a pod asked
for less and less often, and no read of the slices and claims when nothing changed since the last.
A stub stands for the API server: what is under test is when the controller reads and writes."""

from __future__ import annotations

from typing import Any, cast

from gpuslice.controller.retry import RETRY_AT, SchedulerRetry
from gpuslice.kube.client import KubeClient
from tests.unit.planning.cluster_state import claim, published
from tests.unit.planning.reads.test_retry import AWAY, DEVICE, NOTEBOOKS, asks, pod


class Stub:
    def __init__(self) -> None:
        self.pods = [pod("small", AWAY)]
        self.claims = [asks("small", "2Gi"), claim("ds", "big", [("n1", DEVICE)], pods=("big",), consumed="18Gi")]
        self.reads: list[str] = []
        self.patched: list[tuple[str, dict[str, Any]]] = []

    async def list(self, path: str, **query: Any) -> list[dict[str, Any]]:
        self.reads.append(path.rsplit("/", 1)[-1])
        if path.endswith("gpuslicepolicies"):
            return [NOTEBOOKS]
        if path.endswith("/pods"):
            return [{**p, "metadata": {**p["metadata"], "uid": f"uid-{p['metadata']['name']}"}} for p in self.pods]
        if path.endswith("resourceslices"):
            return published("n1", "l4", 1, [NOTEBOOKS])
        return [{**c, "metadata": {**c["metadata"], "namespace": "ds"}} for c in self.claims]

    async def merge_patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        self.patched.append((path, patch))
        return {}


async def test_a_pod_that_fits_is_asked_for_then_less_often_and_unchanged_state_is_not_read_again() -> None:
    stub, version = Stub(), [0]
    retry = SchedulerRetry(cast(KubeClient, stub), 10.0, lambda: version[0])
    asked = await retry._look(now=100.0)
    assert [r.pod for r in asked] == ["ds/small"]
    path, patch = stub.patched[0]
    assert path.endswith("/deviceclasses/notebooks.gpuslice.dev")
    assert RETRY_AT in patch["metadata"]["annotations"]
    assert await retry._look(now=115.0) == []  # asked once: next after 20 s
    stub.reads.clear()
    assert [r.pod for r in await retry._look(now=121.0)] == ["ds/small"]  # then after 40 s
    assert "resourceslices" in stub.reads
    assert await retry._look(now=150.0) == []


async def test_no_room_no_ask_and_no_read_until_a_claim_or_slice_changes() -> None:
    stub, version = Stub(), [0]
    stub.claims[0] = asks("small", "8Gi")  # 4.49Gi free
    retry = SchedulerRetry(cast(KubeClient, stub), 10.0, lambda: version[0])
    assert await retry._look(now=100.0) == []
    assert not stub.patched
    stub.reads.clear()
    assert await retry._look(now=110.0) == []
    assert "resourceslices" not in stub.reads
    assert "resourceclaims" not in stub.reads
    stub.claims.pop()  # the big claim goes: an event bumps the version
    version[0] += 1
    assert [r.pod for r in await retry._look(now=120.0)] == ["ds/small"]


async def test_one_look_per_interval_whichever_daemon_calls() -> None:
    stub = Stub()
    retry = SchedulerRetry(cast(KubeClient, stub), 3600.0)
    assert len(await retry.tick()) == 1
    assert await retry.tick() == []
    assert len(stub.patched) == 1
    assert await SchedulerRetry(cast(KubeClient, stub), 0.0).tick() == []  # 0: off


async def test_the_first_look_is_at_once_on_a_machine_booted_a_second_ago() -> None:
    stub, now = Stub(), [1.0]
    retry = SchedulerRetry(cast(KubeClient, stub), 3600.0, clock=lambda: now[0])
    assert len(await retry.tick()) == 1
    now[0] = 3600.5
    assert await retry.tick() == []
    now[0] = 3601.0
    await retry.tick()
    assert stub.reads.count("pods") == 2


async def test_a_change_that_did_not_help_makes_the_next_wait_longer_whatever_pod_it_is_for() -> None:
    stub = Stub()
    retry = SchedulerRetry(cast(KubeClient, stub), 10.0)
    assert [r.pod for r in await retry._look(now=100.0)] == ["ds/small"]
    stub.pods = [pod("small", AWAY), pod("new", AWAY)]  # small still turned away: the change did not help
    stub.claims.append(asks("new", "1Gi"))
    assert await retry._look(now=110.0) == []  # new is due, but the next change waits 20 s
    assert [r.pod for r in await retry._look(now=121.0)] == ["ds/small", "ds/new"]
    assert len(stub.patched) == 2
    stub.pods = [pod("other", AWAY)]  # both were allocated: that change helped, the gap is back to 10 s
    stub.claims.append(asks("other", "1Gi"))
    assert [r.pod for r in await retry._look(now=140.0)] == ["ds/other"]  # had it not helped: 40 s
    stub.pods = [pod("other", AWAY), pod("late", AWAY)]
    stub.claims.append(asks("late", "1Gi"))
    assert await retry._look(now=151.0) == []  # other still turned away: 20 s from 140


async def test_a_class_gone_is_passed_over_and_a_refused_change_still_backs_off() -> None:
    from gpuslice.kube.client import NotFound

    class Gone(Stub):
        async def merge_patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
            self.patched.append((path, patch))
            raise NotFound(404, "NotFound", path, None)

    stub = Gone()
    retry = SchedulerRetry(cast(KubeClient, stub), 10.0)
    assert await retry._look(now=100.0) == []
    assert len(stub.patched) == 1
    assert await retry._look(now=111.0) == []  # small still waits: asked at 100, next after 20 s
    assert len(stub.patched) == 1
