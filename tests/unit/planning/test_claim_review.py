"""Whether a review is about the claim the API server holds, and what a shared result may have
consumed: what the maxMemory webhook checks before it charges anything."""

from __future__ import annotations

from typing import Any

from gpuslice.dra.wire import MemoryPolicy, memory_policy
from gpuslice.planning.claim_review import Published, not_as_asked, not_the_claim, over_consumed, policy_results

GI = 2**30


def _claim(namespace: str = "team-a", uid: str = "u1", asked: str | None = None,
           results: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": "p.gpuslice.dev"}
    if asked:
        exactly["capacity"] = {"requests": {"memory": asked}}
    body: dict[str, Any] = {"metadata": {"name": "c", "namespace": namespace, "uid": uid},
                            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}
    if results is not None:
        body["status"] = {"allocation": {"devices": {"results": results}}}
    return body


def _result(device: str = "shared", consumed: str | None = None, **more: Any) -> dict[str, Any]:
    found = {"request": "gpu", "driver": "gpu.gpuslice.dev", "pool": "node-1", "device": device, **more}
    if consumed is not None:
        found["consumedCapacity"] = {"memory": consumed}
    return found


REQUEST = {"namespace": "team-a", "name": "c"}


def test_only_the_claim_as_it_is_held_passes() -> None:
    review = _claim(results=[_result(consumed="10Gi")])
    assert not_the_claim(REQUEST, review, _claim()) is None, "not allocated yet: the scheduler's write"
    assert not_the_claim(REQUEST, review, review) is None, "allocated so already: the same write seen again"
    said = {
        "gone": not_the_claim(REQUEST, review, None),
        "made again": not_the_claim(REQUEST, review, _claim(uid="u2")),
        "another spec": not_the_claim(REQUEST, review, _claim(asked="1Gi")),
        "allocated otherwise": not_the_claim(REQUEST, review, _claim(results=[_result(consumed="20Gi")])),
        "another namespace's": not_the_claim({"namespace": "team-b", "name": "c"}, review, _claim()),
        "another name": not_the_claim({**REQUEST, "name": "d"}, review, _claim()),
    }
    for what, why in said.items():
        assert why is not None, what
        for secret in ("u1", "u2", "20Gi"):
            assert secret not in why, f"{what}: tells nothing of the claim: {why}"


def test_a_shared_result_consumes_no_more_than_its_request_rounds_up_to() -> None:
    policy = MemoryPolicy(default=5 * GI, least=5 * GI, step=5 * GI)
    assert [policy.consumed(a) for a in (None, 1, 5 * GI, 5 * GI + 1, 15 * GI)] == [5 * GI, 5 * GI, 5 * GI, 10 * GI,
                                                                                    15 * GI]
    assert memory_policy({"capacity": {"memory": {"value": "80Gi", "requestPolicy": {
        "default": "5Gi", "validRange": {"min": "5Gi", "step": "5Gi"}}}}}) == policy
    assert memory_policy({"capacity": {"memory": {"value": "80Gi"}}}) is None

    def size(pool: str, device: str) -> tuple[int, MemoryPolicy | None] | None:
        return {"shared": (80 * GI, policy), "slice": (10 * GI, None)}.get(device)

    assert over_consumed(_claim(asked="12Gi", results=[_result(consumed="15Gi")]), size) is None
    assert over_consumed(_claim(asked="12Gi", results=[_result(consumed="20Gi")]), size) is not None
    assert over_consumed(_claim(results=[_result(consumed="5Gi")]), size) is None, "no request: the default"
    assert over_consumed(_claim(results=[_result(consumed="10Gi")]), size) is not None
    assert over_consumed(_claim(asked="100Gi", results=[_result(consumed="100Gi")]), size) is not None, "the device"
    assert over_consumed(_claim(results=[_result("slice", consumed="20Gi")]), size) is not None
    assert over_consumed(_claim(results=[_result("unknown", consumed="20Gi")]), size) is None, "charged as is"
    assert over_consumed(_claim(results=[_result(consumed="lots")]), size) is not None


def test_only_results_of_a_policys_classes_are_charged() -> None:
    claim = _claim(results=[_result(), _result(adminAccess=True), {**_result(), "driver": "nic.example.com"},
                            {**_result(), "request": "other"}])
    assert [r["device"] for r in policy_results(claim)] == ["shared"]


FACTS = {"s-0": Published("p", "slice", False), "s-1": Published("p", "slice", False),
         "full": Published("p", "full", False), "shared": Published("p", "shared", True),
         "theirs": Published("q", "slice", False)}


def _asked(*requests: dict[str, Any], results: list[dict[str, Any]]) -> str | None:
    review = {"spec": {"devices": {"requests": list(requests)}},
              "status": {"allocation": {"devices": {"results": results}}}}
    return not_as_asked(review, lambda pool, device: FACTS.get(device),
                        lambda klass: {"p.gpuslice.dev": "slice", "shared.p.gpuslice.dev": "shared"}.get(klass))


def _exactly(name: str = "gpu", klass: str = "p.gpuslice.dev", **more: Any) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": klass, **more}}


def test_an_allocation_answers_each_request_as_the_allocator_would() -> None:
    one, two = _exactly(), _exactly(count=2)
    assert _asked(one, results=[_result("s-0")]) is None
    assert _asked(two, results=[_result("s-0"), _result("s-1")]) is None
    assert _asked(_exactly(allocationMode="All"), results=[_result("s-0"), _result("s-1")]) is None
    either = {"name": "gpu", "firstAvailable": [{"name": "big", "deviceClassName": "full.p.gpuslice.dev"},
                                                {"name": "small", "deviceClassName": "p.gpuslice.dev"}]}
    assert _asked(either, results=[_result("s-0", request="gpu/small")]) is None
    shared = _exactly(klass="shared.p.gpuslice.dev", count=2)
    assert _asked(shared, results=[_result("shared", "5Gi", shareID="a"), _result("shared", "5Gi", shareID="b")]) \
        is None, "a shared device may be taken twice, each a part of it"
    nic = _exactly("nic", "nic.example.com")
    assert _asked(one, nic, results=[_result("s-0"), {**_result("eth0", request="nic"), "driver": "nic.example.com",
                                                       "pool": "node-1-nics"}]) is None, "another driver's request"


def test_a_review_that_answers_more_than_the_claim_asks_is_refused() -> None:
    said = {
        "thirty results for one": _asked(_exactly(), results=[_result("s-0")] * 30),
        "thirty shared results for one": _asked(_exactly(klass="shared.p.gpuslice.dev"),
                                                results=[_result("shared", "5Gi")] * 30),
        "one result for two": _asked(_exactly(count=2), results=[_result("s-0")]),
        "a whole GPU for a slice": _asked(_exactly(), results=[_result("full")]),
        "another policy's device": _asked(_exactly(), results=[_result("theirs")]),
        "another driver's device": _asked(_exactly(), results=[{**_result("eth0"), "driver": "nic.example.com"}]),
        "a request it does not make": _asked(_exactly(), results=[_result("s-0"), _result("s-1", request="more")]),
        "both ways of a firstAvailable": _asked(
            {"name": "gpu", "firstAvailable": [{"name": "a", "deviceClassName": "p.gpuslice.dev"},
                                               {"name": "b", "deviceClassName": "p.gpuslice.dev"}]},
            results=[_result("s-0", request="gpu/a"), _result("s-1", request="gpu/b")]),
        "All, a device twice": _asked(_exactly(allocationMode="All"), results=[_result("s-0")] * 2),
        "a device in two requests": _asked(_exactly("a"), _exactly("b"), results=[_result("s-0", request="a"),
                                                                                 _result("s-0", request="b")]),
        "devices of two nodes": _asked(_exactly(count=2), results=[_result("s-0"), {**_result("s-1"),
                                                                                    "pool": "node-2"}]),
        "a shared result that consumed nothing said": _asked(_exactly(klass="shared.p.gpuslice.dev"),
                                                             results=[_result("shared")]),
        "a device nobody publishes": _asked(_exactly(), results=[_result("ghost")]),
    }
    for what, why in said.items():
        assert why is not None, what
