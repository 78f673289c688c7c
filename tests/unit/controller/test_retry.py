"""The controller's asks to kube-scheduler (controller.retry): once per interval in all, a pod asked
for less and less often, and no read of the slices and claims when nothing changed since the last.
A stub stands for the API server: what is under test is when the controller reads and writes."""

from __future__ import annotations

from typing import Any, cast

from gpuslice.controller.retry import RETRY_AT, SchedulerRetry
from gpuslice.kube.client import KubeClient
from tests.unit.planning.cluster_state import claim, published
from tests.unit.planning.retry_state import AWAY, DEVICE, NOTEBOOKS, asks, pod


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


async def test_a_pod_never_helped_backs_off_only_itself_never_another_pod() -> None:
    """One pod that never fits (a tenant's poison) is asked for less and less often; another pod,
    of the same tenant or another, is asked for at the first look it is due, whatever the poison's
    backoff has reached."""
    stub = Stub()
    retry = SchedulerRetry(cast(KubeClient, stub), 10.0)
    assert [r.pod for r in await retry._look(now=100.0)] == ["ds/small"]
    for now in (120.0, 160.0, 240.0):  # small never helped: asked at 100, 120, 160, 240 (10, 20, 40, 80 s)
        assert [r.pod for r in await retry._look(now=now)] == ["ds/small"]
        assert await retry._look(now=now + 10.0) == []
    stub.pods = [pod("small", AWAY), pod("new", AWAY)]
    stub.claims.append(asks("new", "1Gi"))
    assert [r.pod for r in await retry._look(now=251.0)] == ["ds/new"]  # at once: small waits till 400
    assert [r.pod for r in await retry._look(now=400.0)] == ["ds/small", "ds/new"]  # new: due since 271
    assert len(stub.patched) == 6  # one change per look that asked


async def test_many_poison_pods_make_at_most_one_change_per_look() -> None:
    stub = Stub()
    stub.pods = [pod(f"p{i}", AWAY) for i in range(50)]
    stub.claims = [asks(f"p{i}", "1Gi") for i in range(50)]
    retry = SchedulerRetry(cast(KubeClient, stub), 10.0)
    assert len(await retry._look(now=100.0)) == 50
    assert len(stub.patched) == 1
    assert await retry._look(now=110.0) == []  # each backed off: 20 s
    assert len(stub.patched) == 1


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
