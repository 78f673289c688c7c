"""The controller's asks to kube-scheduler (controller.retry): once per interval in all, a pod asked
for less and less often, and no read of the slices and claims when nothing changed since the last.
A stub stands for the API server: what is under test is when the controller reads and writes. The
pods and policies come from the controller's watches (handed in), never from a read."""

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

    def pending(self) -> list[dict[str, Any]]:
        """The pods not yet on a node, as the controller's watch holds them."""
        return [{**p, "metadata": {**p["metadata"], "uid": f"uid-{p['metadata']['name']}"}} for p in self.pods]

    async def list(self, path: str, **query: Any) -> list[dict[str, Any]]:
        self.reads.append(path.rsplit("/", 1)[-1])
        assert "/namespaces/" not in path, f"a read per namespace: {path}"
        if path.endswith("resourceslices"):
            return published("n1", "l4", 1, [NOTEBOOKS])
        return [{**c, "metadata": {**c["metadata"], "namespace": "ds"}} for c in self.claims]

    async def merge_patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        self.patched.append((path, patch))
        return {}


async def look(retry: SchedulerRetry, stub: Stub, now: float) -> list[Any]:
    return await retry._look(now, [NOTEBOOKS], stub.pending())


async def test_a_pod_that_fits_is_asked_for_then_less_often_and_unchanged_state_is_not_read_again() -> None:
    stub, version = Stub(), [0]
    retry = SchedulerRetry(cast(KubeClient, stub), 10.0, lambda: version[0])
    asked = await look(retry, stub, 100.0)
    assert [r.pod for r in asked] == ["ds/small"]
    path, patch = stub.patched[0]
    assert path.endswith("/deviceclasses/notebooks.gpuslice.dev")
    assert RETRY_AT in patch["metadata"]["annotations"]
    assert await look(retry, stub, 115.0) == []  # asked once: next after 20 s
    stub.reads.clear()
    assert [r.pod for r in await look(retry, stub, 121.0)] == ["ds/small"]  # then after 40 s
    assert "resourceslices" in stub.reads
    assert await look(retry, stub, 150.0) == []


async def test_no_room_no_ask_and_no_read_until_a_claim_or_slice_changes() -> None:
    stub, version = Stub(), [0]
    stub.claims[0] = asks("small", "8Gi")  # 4.49Gi free
    retry = SchedulerRetry(cast(KubeClient, stub), 10.0, lambda: version[0])
    assert await look(retry, stub, 100.0) == []
    assert not stub.patched
    stub.reads.clear()
    assert await look(retry, stub, 110.0) == []
    assert "resourceslices" not in stub.reads
    assert "resourceclaims" not in stub.reads
    stub.claims.pop()  # the big claim goes: an event bumps the version
    version[0] += 1
    assert [r.pod for r in await look(retry, stub, 120.0)] == ["ds/small"]


async def test_one_look_per_interval_whichever_daemon_calls() -> None:
    stub = Stub()
    retry = SchedulerRetry(cast(KubeClient, stub), 3600.0)
    assert len(await retry.tick([NOTEBOOKS], stub.pending())) == 1
    assert await retry.tick([NOTEBOOKS], stub.pending()) == []
    assert len(stub.patched) == 1
    assert await SchedulerRetry(cast(KubeClient, stub), 0.0).tick([NOTEBOOKS], stub.pending()) == []  # 0: off


async def test_the_first_look_is_at_once_on_a_machine_booted_a_second_ago() -> None:
    stub, now = Stub(), [1.0]
    retry = SchedulerRetry(cast(KubeClient, stub), 3600.0, clock=lambda: now[0])
    assert len(await retry.tick([NOTEBOOKS], stub.pending())) == 1
    now[0] = 3600.5
    assert await retry.tick([NOTEBOOKS], stub.pending()) == []
    now[0] = 3601.0
    await retry.tick([NOTEBOOKS], stub.pending())
    assert retry.last == 3601.0  # looked again once the interval was up


async def test_a_pod_never_helped_backs_off_only_itself_never_another_pod() -> None:
    """One pod that never fits (a tenant's poison) is asked for less and less often; another pod,
    of the same tenant or another, is asked for at the first look it is due, whatever the poison's
    backoff has reached."""
    stub = Stub()
    retry = SchedulerRetry(cast(KubeClient, stub), 10.0)
    assert [r.pod for r in await look(retry, stub, 100.0)] == ["ds/small"]
    for now in (120.0, 160.0, 240.0):  # small never helped: asked at 100, 120, 160, 240 (10, 20, 40, 80 s)
        assert [r.pod for r in await look(retry, stub, now)] == ["ds/small"]
        assert await look(retry, stub, now + 10.0) == []
    stub.pods = [pod("small", AWAY), pod("new", AWAY)]
    stub.claims.append(asks("new", "1Gi"))
    assert [r.pod for r in await look(retry, stub, 251.0)] == ["ds/new"]  # at once: small waits till 400
    assert [r.pod for r in await look(retry, stub, 400.0)] == ["ds/small", "ds/new"]  # new: due since 271
    assert len(stub.patched) == 6  # one change per look that asked


async def test_many_poison_pods_make_at_most_one_change_per_look() -> None:
    stub = Stub()
    stub.pods = [pod(f"p{i}", AWAY) for i in range(50)]
    stub.claims = [asks(f"p{i}", "1Gi") for i in range(50)]
    retry = SchedulerRetry(cast(KubeClient, stub), 10.0)
    assert len(await look(retry, stub, 100.0)) == 50
    assert len(stub.patched) == 1
    assert await look(retry, stub, 110.0) == []  # each backed off: 20 s
    assert len(stub.patched) == 1


async def test_a_class_gone_is_passed_over_and_a_refused_change_still_backs_off() -> None:
    from gpuslice.kube.client import NotFound

    class Gone(Stub):
        async def merge_patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
            self.patched.append((path, patch))
            raise NotFound(404, "NotFound", path, None)

    stub = Gone()
    retry = SchedulerRetry(cast(KubeClient, stub), 10.0)
    assert await look(retry, stub, 100.0) == []
    assert len(stub.patched) == 1
    assert await look(retry, stub, 111.0) == []  # small still waits: asked at 100, next after 20 s
    assert len(stub.patched) == 1


async def test_no_pod_waiting_in_a_tenant_namespace_no_request_at_all() -> None:
    """Nothing turned away (or only in a namespace no policy names): a look reads nothing, whatever
    the number of tenants; the pods come from the watch, never from a list per namespace."""
    stub = Stub()
    many = {**NOTEBOOKS, "spec": {**NOTEBOOKS["spec"], "tenants": [{"namespace": f"t{i}"} for i in range(500)]}}
    retry = SchedulerRetry(cast(KubeClient, stub), 10.0)
    assert await retry._look(100.0, [many], stub.pending()) == []  # small waits in ds, no tenant of many
    assert await retry._look(200.0, [NOTEBOOKS], []) == []
    assert stub.reads == []
    assert not stub.patched
