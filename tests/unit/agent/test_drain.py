"""The drain list: what an agent lists, for how long, and how it reads the API server's refusal."""

from __future__ import annotations

from typing import Any, cast

import pytest

from gpuslice.agent.drain import LABEL, MARKER, RECHECK, RETENTION, Drains
from gpuslice.backoff import Backoff
from gpuslice.kube.client import Forbidden, Invalid, KubeClient, NotFound, ServerError


def test_draining_devices_are_listed_and_gone_ones_stay_listed_for_the_retention() -> None:
    drains = Drains()
    listed = drains.wanted({"a", "b"}, before={"a", "b", "c"}, after={"a", "b", "c", "new"}, now=0)
    assert listed == {"a", "b"}
    assert drains.waiting, "newly listed: the next cycle asks the API server"
    drains.listed = listed
    # a and b drained and went; c stays published; "new" was published meanwhile.
    listed = drains.wanted(set(), before={"a", "b", "c", "new"}, after={"c", "new"}, now=10)
    assert listed == {"a", "b"}, "gone, but a late write may still be on its way"
    drains.listed = listed
    assert drains.wanted(set(), before={"c", "new"}, after={"c", "new", "a"}, now=20) == {"b"}, \
        "published again: allocatable again"
    assert drains.wanted(set(), before={"c", "new", "a"}, after={"c", "new", "a"}, now=10 + RETENTION) == set()


async def test_a_restarted_agent_keeps_what_it_finds_listed() -> None:
    class Kube:
        async def get(self, path: str) -> dict[str, Any]:
            assert path.endswith("/configmaps/gpuslice-draining-n1"), "its own node's object, no other"
            return {"data": {"n1": "x y", "n2": "z"}}

    drains = Drains()
    await drains.load(cast(KubeClient, Kube()), "n1", now=0)
    assert drains.listed == {"x", "y"}, "only its own node's key counts"
    assert drains.wanted(set(), before=set(), after={"y"}, now=1) == {"x"}


class Probe:
    def __init__(self, answer: Exception | None) -> None:
        self.answer = answer
        self.bodies: list[dict[str, Any]] = []

    async def create(self, path: str, body: dict[str, Any], **query: Any) -> dict[str, Any]:
        assert query["dryRun"] == "All", "the probe is only ever a dry run"
        self.bodies.append(body)
        if self.answer:
            raise self.answer
        return body


async def test_the_refusal_says_which_devices_no_claim_can_get() -> None:
    refusal = Forbidden(403, "Forbidden", f"... denied request: {MARKER}n1/a n1/b are being changed ...", None)
    drains = Drains(listed={"a", "b", "c"})
    probe = Probe(refusal)
    assert await drains.refused(cast(KubeClient, probe), "n1", {"a", "b", "c", "unlisted"}) == {"a", "b"}
    assert probe.bodies[0]["data"] == {"pool": "n1", "devices": "a b c"}, "only listed devices are asked about"
    assert drains.due_in() is not None, "c is not refused yet: ask again soon"


async def test_devices_held_for_their_claims_are_not_asked_about_again_and_again() -> None:
    drains = Drains(listed=set())
    probe = Probe(None)
    assert await drains.refused(cast(KubeClient, probe), "n1", {"held-1"}) == set()
    assert probe.bodies == []
    assert drains.due_in() is None, "a held device waits for its claim, not for the next cycle"


async def test_no_refusal_means_nothing_has_drained() -> None:
    drains = Drains(listed={"a"})
    assert await drains.refused(cast(KubeClient, Probe(None)), "n1", {"a"}) == set()
    assert drains.due_in() is not None
    assert await Drains().refused(cast(KubeClient, Probe(None)), "n1", set()) == set()


async def test_a_probe_that_cannot_work_fails_safe_and_says_how_to_fix_it(caplog: pytest.LogCaptureFixture) -> None:
    drains = Drains(listed={"a"})
    missing_rbac = Forbidden(403, "Forbidden", 'configmaps is forbidden: User "x" cannot create', None)
    assert await drains.refused(cast(KubeClient, Probe(missing_rbac)), "n1", {"a"}) == set()
    assert drains.warned
    with pytest.raises(ServerError):  # not an answer: the cycle fails and is retried
        await drains.refused(cast(KubeClient, Probe(ServerError(503, "x", "y", None))), "n1", {"a"})


async def test_no_drain_object_means_nothing_is_listed() -> None:
    class Kube:
        async def get(self, path: str) -> dict[str, Any]:
            raise NotFound(404, "NotFound", "configmaps gpuslice-draining-n1 not found", None)

    drains = Drains()
    await drains.load(cast(KubeClient, Kube()), "n1")
    assert not drains.warned, "a node that never drained has no object"
    assert drains.listed == set()


class Writes:
    """The API server as the agent writes its drain object: apply and delete, refused on cue."""

    def __init__(self, refusal: Exception | None = None) -> None:
        self.refusal = refusal
        self.calls: list[tuple[str, str, dict[str, Any] | None]] = []

    async def apply(self, path: str, body: dict[str, Any], **_: Any) -> dict[str, Any]:
        self.calls.append(("apply", path, body))
        if self.refusal:
            raise self.refusal
        return body

    async def delete(self, path: str, **_: Any) -> dict[str, Any]:
        self.calls.append(("delete", path, None))
        raise NotFound(404, "NotFound", "gone already", None)


async def test_each_node_writes_its_own_labelled_object_and_deletes_it_when_nothing_is_listed() -> None:
    kube = Writes()
    drains = Drains()
    await drains.write(cast(KubeClient, kube), "n1", {"b", "a"})
    [(verb, path, body)] = kube.calls
    assert (verb, path) == ("apply", "/api/v1/namespaces/gpuslice-system/configmaps/gpuslice-draining-n1")
    assert body is not None
    assert body["data"] == {"n1": "a b"}
    assert body["metadata"]["labels"] == {LABEL: "true"}
    await drains.write(cast(KubeClient, kube), "n1", set())
    assert kube.calls[-1][:2] == ("delete", path), "nothing listed: no object, no parameter for the rule"
    assert drains.listed == set()


def _waits(drains: Drains, cycles: int) -> list[float]:
    return [w for _ in range(cycles) if (w := drains.due_in()) is not None]


async def test_a_drain_that_cannot_progress_asks_again_less_and_less_often() -> None:
    """H2 of the December review: a refused write (or a rule not in force) made the agent run a cycle,
    and read every claim in the cluster, every 0.5 s without end."""
    refused = Invalid(422, "Invalid", "Too long: may not be more than 1048576 bytes", None)
    drains = Drains(recheck=Backoff(RECHECK, 60.0))
    listed = drains.wanted({"a"}, before={"a"}, after={"a"}, now=0)
    await drains.write(cast(KubeClient, Writes(refused)), "n1", listed)
    assert drains.warned
    assert drains.listed == set(), "refused: nothing listed, the device stays as it is"
    waits = _waits(drains, 12)
    assert waits[0] <= 1.5 * RECHECK
    nominal = [RECHECK * 2**i for i in range(12)]
    assert all(0.5 * min(n, 60.0) <= w <= min(1.5 * n, 60.0) for w, n in zip(waits, nominal, strict=True)), waits
    assert sum(waits[:7]) > 30, "at most seven cycles in the first half minute"
    assert waits[-1] >= 30, "then about one a resync"


async def test_progress_asks_again_soon_and_nothing_waiting_asks_nothing() -> None:
    drains = Drains(recheck=Backoff(RECHECK, 60.0))
    _waits(drains, 1)
    assert drains.due_in() is None, "nothing waits"
    listed = drains.wanted({"a"}, before={"a"}, after={"a"}, now=0)
    for _ in range(5):
        drains.due_in()  # the rule took its time
    await drains.write(cast(KubeClient, Writes()), "n1", listed)
    wait = drains.due_in()
    assert wait is not None
    assert wait <= 1.5 * RECHECK, "newly listed: asked about soon"
    refusal = Forbidden(403, "Forbidden", f"denied: {MARKER}n1/a are being changed", None)
    assert await drains.refused(cast(KubeClient, Probe(refusal)), "n1", {"a"}) == {"a"}
    assert drains.due_in() is None, "drained: no cycle waits for it"
    spread_out = {round(Drains(waiting=True).due_in() or 0, 4) for _ in range(30)}
    assert len(spread_out) > 1, "jittered: a fleet does not ask again in step"


async def test_many_devices_are_asked_about_in_probes_whose_refusal_the_server_can_word() -> None:
    """The API server words a refusal only up to 5 KiB; past that it names no device at all."""
    names = [f"gpu-{i:08x}-mem-1gi-{j}" for i in range(8) for j in range(40)]

    class Rule:
        def __init__(self) -> None:
            self.asked: list[list[str]] = []

        async def create(self, path: str, body: dict[str, Any], **query: Any) -> dict[str, Any]:
            asked = body["data"]["devices"].split()
            self.asked.append(asked)
            message = f"{MARKER}{' '.join(f'n1/{d}' for d in asked)} are being changed or removed by gpuslice"
            assert len(message.encode()) <= 5 * 1024 - 100, "the server would drop this message for its static one"
            raise Forbidden(403, "Forbidden", message, None)

    rule = Rule()
    drains = Drains(listed=set(names))
    assert await drains.refused(cast(KubeClient, rule), "n1", set(names)) == set(names)
    assert len(rule.asked) > 1
    assert sorted(d for batch in rule.asked for d in batch) == sorted(names)
    assert drains.due_in() is None


async def test_a_device_refused_again_and_again_is_no_progress() -> None:
    """Only news shortens the wait: a device the probe keeps refusing (it waits on something else,
    e.g. a GPU's other devices) does not make the agent ask twice a second."""
    refusal = Forbidden(403, "Forbidden", f"denied: {MARKER}n1/a are being changed", None)
    drains = Drains(listed={"a", "b"}, recheck=Backoff(RECHECK, 60.0))
    for _ in range(6):
        await drains.refused(cast(KubeClient, Probe(refusal)), "n1", {"a", "b"})
        wait = drains.due_in()
    assert wait is not None
    assert wait >= 0.5 * RECHECK * 2**5, "b still waits, and a refused again is nothing new"
