"""The overuse mark from agent to controller: what the agent writes, what a restarted agent reads
back, and which pods the controller may act on, as a rogue node would try to stretch it."""

from __future__ import annotations

import json
from typing import Any

from gpuslice.dra.names import DRIVER
from gpuslice.planning.overuse import (
    MAX_PODS,
    DeviceKey,
    Mark,
    Overuser,
    allocation_node,
    device_entry,
    overusing_pods,
    read_marks,
    summary,
)

A, B = "0f3a7c4e-1111-4c2a-9a51-000000000001", "0f3a7c4e-2222-4c2a-9a51-000000000002"
NODE = "node-a"


def on_node(node: str) -> dict[str, Any]:
    return {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}


def claim_status(marks: dict[DeviceKey, Mark], *, node: str = NODE, reserved: tuple[str, ...] = (A, B),
                 devices: tuple[str, ...] = ("d0",)) -> dict[str, Any]:
    """A claim allocated on ``node`` (our devices in its pool), reserved for pods a and b, with the marks."""
    return {
        "allocation": {"nodeSelector": on_node(node), "devices": {"results": [
            {"request": "gpu", "driver": DRIVER, "pool": node, "device": d} for d in devices]}},
        "reservedFor": [{"resource": "pods", "name": {A: "a", B: "b"}.get(uid, "other"), "uid": uid}
                        for uid in reserved],
        "devices": [device_entry(key, mark) for key, mark in marks.items()],
    }


def over(*uids: str, since: str = "2026-12-01T10:00:00Z") -> Mark:
    users = tuple(Overuser(uid, f"pod-{uid[-1]}", since, f"pod team-a/pod-{uid[-1]} uses 12Gi") for uid in uids)
    return Mark(users, summary(users), since)


def test_a_mark_round_trips_and_says_true_only_while_it_names_pods() -> None:
    key = DeviceKey(NODE, "d0")
    status = claim_status({key: over(A, B), DeviceKey(NODE, "d1", "share-1"): Mark((), "back within", "t0")},
                          devices=("d0", "d1"))
    [entry, shared] = status["devices"]
    assert entry["conditions"][0]["status"] == "True"
    assert entry["conditions"][0]["reason"] == "OverAllocation"
    assert entry["conditions"][0]["message"] == "pod team-a/pod-1 uses 12Gi (and 1 more pods)"
    assert shared["shareID"] == "share-1"
    assert shared["conditions"][0]["status"] == "False"
    marks = read_marks(status, NODE)
    assert [o.uid for o in marks[key].overusers] == [A, B]
    assert marks[key].same(over(B, A)), "the same pods, whatever their order and words"
    assert not marks[key].same(over(A))
    assert read_marks(status, "node-b") == {}, "another node's agent starts from nothing"


def test_a_mark_never_outgrows_the_entrys_data_limit() -> None:
    users = tuple(Overuser(f"{i:08d}-0000-4000-8000-000000000000", "p" * 253, "2026-12-01T10:00:00Z", "m" * 5000)
                  for i in range(300))
    entry = device_entry(DeviceKey(NODE, "d0"), Mark(users, "x", "t"))
    assert 0 < len(entry["data"]["overusingPods"]) <= MAX_PODS
    assert len(json.dumps(entry["data"])) <= 10 * 1024
    usual = tuple(Overuser(u.uid, "pod", u.since, "pod team-a/pod uses 12Gi") for u in users[:20])
    assert len(device_entry(DeviceKey(NODE, "d0"), Mark(usual, "x", "t"))["data"]["overusingPods"]) == MAX_PODS


def test_a_condition_true_without_names_is_read_as_true() -> None:
    """An agent of an earlier version wrote no names: a restarted agent must still turn it False."""
    status = claim_status({})
    status["devices"] = [{"driver": DRIVER, "pool": NODE, "device": "d0", "conditions": [
        {"type": "GpuMemoryOveruse", "status": "True", "reason": "OverAllocation", "message": "m",
         "lastTransitionTime": "t"}]}]
    [mark] = read_marks(status, NODE).values()
    assert mark.over
    assert mark.overusers == ()
    assert not Mark((), "back", "t2").same(mark)


def test_the_controller_acts_only_on_reserving_pods_named_on_the_claims_own_node_devices() -> None:
    key = DeviceKey(NODE, "d0")
    [pod] = overusing_pods("team-a", "c", claim_status({key: over(A)}))
    assert (pod.namespace, pod.name, pod.uid, pod.node, pod.claim, pod.device) == ("team-a", "a", A, NODE, "c", "d0")
    assert pod.message == "pod team-a/pod-1 uses 12Gi"
    # A pod the claim is not reserved for (another namespace's, a deleted one): named, not acted on.
    stranger = "0f3a7c4e-3333-4c2a-9a51-000000000003"
    assert overusing_pods("team-a", "c", claim_status({key: over(stranger)})) == []
    # The name comes from the claim's own record, not the mark's.
    assert overusing_pods("team-a", "c", claim_status({key: over(B)}))[0].name == "b"


def test_marks_the_claims_node_could_not_have_written_prove_nothing() -> None:
    # A mark in another pool than the allocation's node: not that node's agent's to write.
    foreign = claim_status({DeviceKey("node-b", "d0"): over(A)})
    assert overusing_pods("team-a", "c", foreign) == []
    # A device the claim was not allocated.
    assert overusing_pods("team-a", "c", claim_status({DeviceKey(NODE, "d9"): over(A)})) == []
    # An allocation no node-bound identity may write for (not exactly one node): nobody's mark counts.
    wide = claim_status({DeviceKey(NODE, "d0"): over(A)})
    wide["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchExpressions"] = [
        {"key": "zone", "operator": "In", "values": ["z"]}]
    assert allocation_node(wide) == ""
    assert overusing_pods("team-a", "c", wide) == []
    unallocated = claim_status({DeviceKey(NODE, "d0"): over(A)})
    del unallocated["allocation"]
    assert overusing_pods("team-a", "c", unallocated) == []
    # A pod named twice (two devices) is one pod.
    twice = claim_status({DeviceKey(NODE, "d0"): over(A), DeviceKey(NODE, "d1"): over(A)}, devices=("d0", "d1"))
    assert [p.uid for p in overusing_pods("team-a", "c", twice)] == [A]


def test_the_mark_says_which_of_a_claims_pods_to_evict_and_names_those_first() -> None:
    """A claim shared by many pods: every one is named, those to evict first, so that the cap on names
    never hides one the controller must evict."""
    key = DeviceKey(NODE, "d0")
    users = tuple(Overuser(f"{i:08d}-0000-4000-8000-000000000000", f"w{i}", "t", "m", evict=i >= 30)
                  for i in range(40))
    entry = device_entry(key, Mark(users, "m", "t"))
    named = entry["data"]["overusingPods"]
    assert len(named) == MAX_PODS
    assert all(p["evict"] for p in named[:10])
    assert not any(p["evict"] for p in named[10:])
    [mark] = read_marks({"devices": [entry]}, NODE).values()
    assert sum(o.evict for o in mark.overusers) == 10
    keep = Mark((Overuser(A, "a", "t", "m", evict=False), Overuser(B, "b", "t", "m")), "m", "t")
    assert not keep.same(Mark((Overuser(A, "a", "t", "m"), Overuser(B, "b", "t", "m")), "m", "t")), \
        "a pod chosen to go is a change to write"


def test_a_mark_without_a_choice_evicts_every_pod_it_names() -> None:
    """An agent from before claims were judged whole named only pods over on their own."""
    status = claim_status({DeviceKey(NODE, "d0"): over(A, B)})
    for pod in status["devices"][0]["data"]["overusingPods"]:
        del pod["evict"]
    assert [(p.name, p.evict) for p in overusing_pods("team-a", "c", status)] == [("a", True), ("b", True)]


def test_a_pod_chosen_on_any_of_the_claims_devices_is_chosen() -> None:
    kept = Mark((Overuser(A, "a", "t", "m", evict=False),), "m", "t")
    going = Mark((Overuser(A, "a", "t", "m", evict=True),), "m", "t")
    status = claim_status({DeviceKey(NODE, "d0"): kept, DeviceKey(NODE, "d1"): going}, devices=("d0", "d1"))
    [pod] = overusing_pods("team-a", "c", status)
    assert pod.evict
    [pod] = overusing_pods("team-a", "c", claim_status({DeviceKey(NODE, "d0"): kept}))
    assert not pod.evict
