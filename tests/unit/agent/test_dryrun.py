"""Which policies the API server refuses, from its answers to dry runs; and when to ask again."""

from __future__ import annotations

from typing import Any, cast

import pytest

from gpuslice.agent.dryrun import (
    ACCEPTED_FOR,
    FIRST_RETRY,
    LAST_RETRY,
    Accepted,
    GenerationRefused,
    Refusals,
    dry_run,
    refused_policies,
)
from gpuslice.kube.client import Forbidden, Invalid, KubeClient, KubeError, NotReady, ServerError


def device(name: str, policy: str) -> dict[str, Any]:
    return {"name": name, "attributes": {"gpuslice.dev/policy": {"string": policy}}}


def slice_of(name: str, devices: list[dict[str, Any]] | None = None, counters: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"sharedCounters": [{"name": "gpu-1"}]} if counters else {"devices": devices or []}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name}, "spec": spec}


class Server:
    """Refuses any slice holding a device of ``bad`` (as an admission rule would: no field named)."""

    def __init__(self, bad: set[str], error: type[KubeError] = Forbidden) -> None:
        self.bad, self.error, self.asked = bad, error, 0

    async def apply(self, path: str, body: dict[str, Any], *, field_manager: str, force: bool = True,
                    dry_run: bool = False) -> dict[str, Any]:
        assert dry_run
        self.asked += 1
        found = {d["attributes"]["gpuslice.dev/policy"]["string"] for d in body["spec"].get("devices") or []}
        if found & self.bad or (body["spec"].get("sharedCounters") and "counters" in self.bad):
            raise self.error(403, "Forbidden", f"denied: {sorted(found & self.bad)}", None)
        return body


async def test_a_rule_that_names_no_field_is_pinned_on_the_policy_by_asking_about_each() -> None:
    manifests = [slice_of("c", counters=True), slice_of("d0", [device("a1", "a"), device("b1", "b")]),
                 slice_of("d1", [device("b2", "b")])]
    server = Server({"b"})
    kube = cast(KubeClient, server)
    refused = await dry_run(kube, manifests, "m")
    assert set(refused) == {"d0", "d1"}
    blamed = await refused_policies(kube, manifests, refused, "m")
    assert set(blamed) == {"b"}
    assert "denied: ['b']" in blamed["b"]


async def test_a_validation_error_names_the_device() -> None:
    error = Invalid(422, "Invalid", "spec.devices[1].capacity: step too large", {"details": {"causes": [
        {"field": "spec.devices[1].capacity[memory].requestPolicy.validRange.step", "message": "too large"}]}})
    manifest = slice_of("d0", [device("a1", "a"), device("b1", "b")])
    server = Server(set())
    assert await refused_policies(cast(KubeClient, server), [manifest], {"d0": error}, "m") == {
        "b": "spec.devices[1].capacity: step too large"}
    assert server.asked == 0, "the field says which device: no more questions"


async def test_a_refusal_no_policy_explains_writes_nothing() -> None:
    manifests = [slice_of("c", counters=True), slice_of("d0", [device("a1", "a")])]
    server = Server({"counters"})
    kube = cast(KubeClient, server)
    with pytest.raises(GenerationRefused, match="slice c of the pool's next generation"):
        await refused_policies(kube, manifests, await dry_run(kube, manifests, "m"), "m")
    every = Server({"a", "b"})
    both = [slice_of("d0", [device("a1", "a"), device("b1", "b")])]
    with pytest.raises(GenerationRefused):  # every policy alone is refused too: it is the slice, not a policy
        await refused_policies(cast(KubeClient, every), both, await dry_run(cast(KubeClient, every), both, "m"), "m")


def generation(manifest: dict[str, Any], number: int) -> dict[str, Any]:
    return {**manifest, "spec": {**manifest["spec"], "pool": {"name": "n", "generation": number,
                                                               "resourceSliceCount": 2}}}


async def test_a_slice_accepted_is_not_asked_about_again_while_its_yes_stands() -> None:
    """A cycle whose write failed (a 429 of a loaded server) writes the same slices at the next
    generation without asking again; new content, or a yes older than ACCEPTED_FOR, is asked."""
    server, accepted = Server({"b"}), Accepted()
    kube = cast(KubeClient, server)
    first = [generation(slice_of("c", counters=True), 1), generation(slice_of("d0", [device("a1", "a")]), 1)]
    assert await dry_run(kube, first, "m", accepted) == {}
    assert server.asked == 2
    again = [generation(m, 2) for m in first]
    assert await dry_run(kube, again, "m", accepted) == {}
    assert server.asked == 2, "the same content at the next generation: no question"
    changed = [again[0], generation(slice_of("d0", [device("a1", "a"), device("a2", "a")]), 2)]
    assert await dry_run(kube, changed, "m", accepted) == {}
    assert server.asked == 3, "only the slice whose devices changed is asked about"
    name = "d0"
    content, at = accepted.by_name[name]
    accepted.by_name[name] = (content, at - ACCEPTED_FOR)
    assert await dry_run(kube, changed, "m", accepted) == {}
    assert server.asked == 4, "a yes older than ACCEPTED_FOR is asked again"


async def test_a_slice_refused_or_dropped_is_never_taken_as_accepted() -> None:
    server, accepted = Server({"b"}), Accepted()
    kube = cast(KubeClient, server)
    bad = [slice_of("d0", [device("b1", "b")])]
    assert set(await dry_run(kube, bad, "m", accepted)) == {"d0"}
    assert set(await dry_run(kube, bad, "m", accepted)) == {"d0"}
    assert server.asked == 2
    assert accepted.by_name == {}

    class Drops:
        asked = 0

        async def apply(self, path: str, body: dict[str, Any], **_: Any) -> dict[str, Any]:
            Drops.asked += 1
            devices = [{k: v for k, v in d.items() if k != "taints"} for d in body["spec"]["devices"]]
            return {**body, "spec": {**body["spec"], "devices": devices}}

    capacity = [slice_of("d0", [device("a1", "a") | {"taints": [{"key": "k", "effect": "NoSchedule"}]}])]
    for _ in range(2):
        refused = await dry_run(cast(KubeClient, Drops()), capacity, "m", accepted)
        assert refused["d0"].reason == "FieldsDropped"
    assert Drops.asked == 2
    assert accepted.by_name == {}


async def test_a_server_that_cannot_answer_is_not_a_refusal() -> None:
    class Down:
        async def apply(self, *_: Any, **__: Any) -> dict[str, Any]:
            raise ServerError(503, "ServiceUnavailable", "etcd", None)

    with pytest.raises(ServerError):
        await dry_run(cast(KubeClient, Down()), [slice_of("d0")], "m")


def test_a_refused_policy_is_tried_again_after_a_growing_wait_or_when_it_changes() -> None:
    refusals = Refusals()
    refusals.record({"b": "no"}, {"b": 1}, now=0)
    assert refusals.current({"b": 1}, now=FIRST_RETRY * 0.49) == {"b": "no"}
    assert refusals.current({"b": 1}, now=FIRST_RETRY * 1.5) == {}, "tried again (the wait is jittered by half)"
    refusals.record({"b": "no"}, {"b": 1}, now=FIRST_RETRY * 1.5)
    assert refusals.current({"b": 1}, now=FIRST_RETRY * 2.49) == {"b": "no"}, "refused again: waits twice as long"
    assert refusals.current({"b": 1}, now=FIRST_RETRY * 4.5) == {}
    assert refusals.current({"b": 2}, now=FIRST_RETRY * 2.5) == {}, "the policy changed: tried at once"
    waits = set()
    for _ in range(20):
        spread_out = Refusals()
        spread_out.record({"b": "no"}, {"b": 1}, now=0)
        waits.add(round(spread_out.by_policy["b"].until, 3))
    assert len(waits) > 1, "a fleet refused together does not try again in step"
    for step in range(20):
        refusals.record({"b": "no"}, {"b": 2}, now=step * 1000)
    assert refusals.by_policy["b"].wait == LAST_RETRY
    assert refusals.current({}, now=0) == {}
    assert refusals.by_policy == {}, "a deleted policy is forgotten"


async def test_an_api_server_not_ready_to_judge_refuses_nothing() -> None:
    """A just-started API server answers 403 "not yet ready" for what its admission would judge: the
    cycle fails and is tried again; no policy is set aside for minutes as if the server had said no."""
    server = Server({"b"}, error=NotReady)
    with pytest.raises(NotReady):
        await dry_run(cast(KubeClient, server), [slice_of("d0", [device("b1", "b")])], "m")


async def test_a_field_the_server_drops_without_an_error_counts_as_a_refusal() -> None:
    """A feature gate off on the apiserver that answers: devices without their counters would let the
    scheduler hand out a GPU's memory twice, so they are not written."""
    safe = {**device("a1", "a"), "consumesCounters": [{"counterSet": "gpu-1", "counters": {"memory": {"value": "1G"}}}]}
    shared = {**device("b1", "b"), "allowMultipleAllocations": True,
              "capacity": {"memory": {"value": "80G", "requestPolicy": {"default": "1G"}}}}

    class Gated(Server):
        async def apply(self, path: str, body: dict[str, Any], *, field_manager: str, force: bool = True,
                        dry_run: bool = False) -> dict[str, Any]:
            stored = {**body, "spec": {**body["spec"], "devices": [
                {k: v for k, v in d.items() if k != "consumesCounters"} for d in body["spec"].get("devices") or []]}}
            return stored

    manifests = [slice_of("d0", [safe, shared])]
    kube = cast(KubeClient, Gated(set()))
    refused = await dry_run(kube, manifests, "m")
    assert "spec.devices[0].consumesCounters" in refused["d0"].message
    assert "DRAPartitionableDevices" in refused["d0"].message
    assert set(await refused_policies(kube, manifests, refused, "m")) == {"a"}, "only the policy that lost a field"
    assert await dry_run(cast(KubeClient, Server(set())), manifests, "m") == {}, "kept as sent: nothing refused"
