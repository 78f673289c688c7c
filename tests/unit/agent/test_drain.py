"""The drain list: what an agent lists, for how long, and how it reads the API server's refusal."""

from __future__ import annotations

from typing import Any, cast

import pytest

from gpuslice.agent.drain import MARKER, RETENTION, Drains
from gpuslice.kube.client import Forbidden, KubeClient, NotFound, ServerError


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
            return {"data": {"n1": "x y", "n2": "z"}}

    drains = Drains()
    await drains.load(cast(KubeClient, Kube()), "n1", now=0)
    assert drains.listed == {"x", "y"}
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


async def test_a_missing_drain_list_fails_safe() -> None:
    class Kube:
        async def get(self, path: str) -> dict[str, Any]:
            raise NotFound(404, "NotFound", "configmaps gpuslice-draining not found", None)

    drains = Drains()
    await drains.load(cast(KubeClient, Kube()), "n1")
    assert drains.warned
    assert drains.listed == set()


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
