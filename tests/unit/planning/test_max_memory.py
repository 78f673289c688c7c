"""maxMemory's arithmetic: what an allocation holds, the least a claim asks, a ledger's verdicts,
and the recalculation that may raise a charge at once but lowers or releases one only when the
API server confirmed it."""

from __future__ import annotations

import datetime
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from gpuslice.api.ledger import Charge
from gpuslice.api.status import ClassInForce
from gpuslice.planning.max_memory import ClaimState, held_by_policy, judge, least_asked, reckon

GI = 2**30
NOW = datetime.datetime(2026, 12, 2, 12, 0, tzinfo=datetime.UTC)
GRACE = datetime.timedelta(seconds=60)
CLASSES = {c.name: c for c in (
    ClassInForce(name="p.gpuslice.dev", kind="shared", shared=True, memory="1Gi", least_memory="1Gi"),
    ClassInForce(name="m.gpuslice.dev", kind="slice", memory="10Gi", least_memory="10Gi"),
    ClassInForce(name="full.m.gpuslice.dev", kind="full", memory="80Gi", least_memory="40Gi"),
)}


def _at(seconds_ago: float) -> str:
    return (NOW - datetime.timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _claim(requests: list[dict[str, Any]], results: list[dict[str, Any]]) -> dict[str, Any]:
    return {"metadata": {"name": "c", "uid": "u"}, "spec": {"devices": {"requests": requests}},
            "status": {"allocation": {"devices": {"results": results}}}}


def test_an_allocation_holds_what_it_consumed_or_its_devices_memory_per_policy() -> None:
    claim = _claim(
        [{"name": "a", "exactly": {"deviceClassName": "p.gpuslice.dev"}},
         {"name": "b", "firstAvailable": [{"name": "x", "deviceClassName": "full.m.gpuslice.dev"},
                                          {"name": "y", "deviceClassName": "m.gpuslice.dev"}]},
         {"name": "c", "exactly": {"deviceClassName": "m.gpuslice.dev", "adminAccess": True}},
         {"name": "d", "exactly": {"deviceClassName": "other.example.com"}}],
        [{"request": "a", "driver": "gpu.gpuslice.dev", "pool": "n", "device": "s", "consumedCapacity": {"memory": "3Gi"}},
         {"request": "a", "driver": "gpu.gpuslice.dev", "pool": "n", "device": "s2", "consumedCapacity": {"memory": "2Gi"}},
         {"request": "b/y", "driver": "gpu.gpuslice.dev", "pool": "n", "device": "slice-1"},
         {"request": "c", "driver": "gpu.gpuslice.dev", "pool": "n", "device": "slice-2", "adminAccess": True},
         {"request": "d", "driver": "other.example.com", "pool": "n", "device": "z"}])
    memory = {("n", "slice-1"): 10 * GI, ("n", "slice-2"): 10 * GI}
    assert held_by_policy(claim, lambda pool, device: memory.get((pool, device))) == {"p": 5 * GI, "m": 10 * GI}


def test_the_least_a_claim_asks_counts_every_way_it_could_be_allocated() -> None:
    spec = {"devices": {"requests": [
        {"name": "a", "exactly": {"deviceClassName": "p.gpuslice.dev", "count": 3,
                                  "capacity": {"requests": {"memory": "1500Mi"}}}},  # rounds up to 2Gi each
        {"name": "b", "exactly": {"deviceClassName": "p.gpuslice.dev", "allocationMode": "All"}},
        {"name": "c", "firstAvailable": [{"name": "x", "deviceClassName": "p.gpuslice.dev", "count": 8},
                                         {"name": "y", "deviceClassName": "p.gpuslice.dev", "count": 2}]},
    ]}}
    assert least_asked(spec, "p", CLASSES) == (6 + 1 + 2) * GI
    whole = {"devices": {"requests": [{"name": "w", "exactly": {"deviceClassName": "full.m.gpuslice.dev"}}]}}
    assert least_asked(whole, "m", CLASSES) == 40 * GI  # the smallest GPU: never refused for what it might be
    elsewhere = {"devices": {"requests": [{"name": "e", "firstAvailable": [
        {"name": "x", "deviceClassName": "m.gpuslice.dev", "count": 9},
        {"name": "y", "deviceClassName": "other.example.com"}]}]}}
    assert least_asked(elsewhere, "m", CLASSES) == 0


def test_a_retried_allocation_is_charged_once() -> None:
    charges = [Charge(claim="a", uid="ua", bytes=20 * GI, at=_at(5))]
    first = judge(charges, 30 * GI, "b", "ub", 8 * GI, _at(0), 100)
    assert first.allowed
    again = judge(list(first.charges), 30 * GI, "b", "ub", 8 * GI, _at(0), 100)
    assert again.allowed
    assert sum(c.bytes for c in again.charges) == 28 * GI
    assert not judge(list(again.charges), 30 * GI, "c", "uc", 4 * GI, _at(0), 100).allowed
    assert not judge(list(again.charges), 30 * GI, "c", "uc", 1, _at(0), 2).allowed  # at most 2 charges


def test_a_review_never_lowers_a_charge() -> None:
    """A tenant with 20Gi holds a and b (10Gi each); a review saying a consumed 0 leaves a's charge at
    10Gi (before the second December review it was lowered, and a third 10Gi was admitted)."""
    held = [Charge(claim=n, uid=f"u{n}", bytes=10 * GI, at=_at(30)) for n in "ab"]
    lowered = judge(held, 20 * GI, "a", "ua", 0, _at(0), 100)
    assert lowered.allowed
    assert {c.uid: c.bytes for c in lowered.charges} == {"ua": 10 * GI, "ub": 10 * GI}
    assert not judge(list(lowered.charges), 20 * GI, "c", "uc", 10 * GI, _at(0), 100).allowed
    raised = judge(held, 30 * GI, "a", "ua", 20 * GI, _at(0), 100)
    assert {c.uid: c.bytes for c in raised.charges} == {"ua": 20 * GI, "ub": 10 * GI}


@given(st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 8)), max_size=40), st.integers(1, 40))
def test_judged_in_any_order_no_charge_ever_goes_down(asks: list[tuple[str, int]], limit: int) -> None:
    charges: list[Charge] = []
    for claim, gib in asks:
        before = {c.uid: c.bytes for c in charges}
        verdict = judge(charges, limit * GI, claim, f"u{claim}", gib * GI, _at(0), 4096)
        if verdict.allowed:
            charges = list(verdict.charges)
        assert all(c.bytes >= before.get(c.uid, 0) for c in charges)


@given(st.lists(st.tuples(st.sampled_from("abcdefgh"), st.integers(1, 8)), max_size=40), st.integers(1, 40))
def test_judged_one_after_another_the_charges_never_pass_the_limit(asks: list[tuple[str, int]], limit: int) -> None:
    charges: list[Charge] = []
    for claim, gib in asks:
        verdict = judge(charges, limit * GI, claim, f"u{claim}", gib * GI, _at(0), 4096)
        if verdict.allowed:
            charges = list(verdict.charges)
        assert sum(c.bytes for c in charges) <= limit * GI
        assert len({c.uid for c in charges}) == len(charges)


def test_what_is_allocated_is_charged_at_once_and_released_only_when_confirmed() -> None:
    charges = [Charge(claim="gone", uid="u1", bytes=4 * GI, at=_at(300)),
               Charge(claim="failed", uid="u2", bytes=2 * GI, at=_at(300)),
               Charge(claim="inflight", uid="u3", bytes=2 * GI, at=_at(5)),
               Charge(claim="held", uid="u4", bytes=8 * GI, at=_at(300))]
    claims = {"u2": ClaimState("failed", "u2", None), "u3": ClaimState("inflight", "u3", None),
              "u4": ClaimState("held", "u4", 4 * GI), "u5": ClaimState("new", "u5", 6 * GI)}
    seen = reckon(charges, claims, NOW, GRACE)
    # Nothing lowered or released on what a watch says; the claim no charge counts is charged now.
    assert {c.uid: c.bytes for c in seen.charges} == {"u1": 4 * GI, "u2": 2 * GI, "u3": 2 * GI, "u4": 8 * GI,
                                                     "u5": 6 * GI}
    assert sorted(seen.confirm) == ["failed", "gone", "held"]
    sure = reckon(charges, claims, NOW, GRACE, confirmed=["failed", "gone", "held"])
    # Confirmed: the deleted claim and the write that never happened are released, the smaller
    # allocation charged as it is; the allocation still in flight keeps its charge.
    assert {c.uid: c.bytes for c in sure.charges} == {"u3": 2 * GI, "u4": 4 * GI, "u5": 6 * GI}


@given(st.dictionaries(st.sampled_from(["u1", "u2", "u3", "u4"]), st.integers(0, 8), max_size=4),
       st.dictionaries(st.sampled_from(["u1", "u2", "u3", "u4"]), st.one_of(st.none(), st.integers(1, 8)), max_size=4),
       st.lists(st.sampled_from(["c-u1", "c-u2", "c-u3", "c-u4"]), max_size=4))
def test_the_recalculation_never_counts_less_than_is_allocated(charged: dict[str, int], held: dict[str, int | None],
                                                               confirmed: list[str]) -> None:
    """Whatever the claims and whatever was confirmed, every allocated claim is charged at least
    what it holds."""
    charges = [Charge(claim=f"c-{u}", uid=u, bytes=b * GI, at=_at(300)) for u, b in charged.items()]
    claims = {u: ClaimState(f"c-{u}", u, None if h is None else h * GI) for u, h in held.items()}
    result = reckon(charges, claims, NOW, GRACE, confirmed)
    after = {c.uid: c.bytes for c in result.charges}
    for uid, state in claims.items():
        if state.held:
            assert after.get(uid, 0) >= state.held
