"""Which pods the scheduler turned away would fit now (planning.reads.retry)."""

from __future__ import annotations

from typing import Any

from gpuslice.planning.reads.availability import room_for
from gpuslice.planning.reads.occupancy import occupancy
from gpuslice.planning.reads.published import read_pools
from gpuslice.planning.reads.retry import to_retry, turned_away
from tests.unit.planning.cluster_state import claim, published
from tests.unit.planning.retry_state import AWAY, DEVICE, NOTEBOOKS, asks, pod


def retries(pods: list[dict[str, Any]], waiting: list[dict[str, Any]], held: list[dict[str, Any]]) -> list[str]:
    slices = published("n1", "l4", 1, [NOTEBOOKS])
    gpus = occupancy(read_pools(slices, held)).gpus
    claims = {f"ds/{c['metadata']['name']}": c for c in [*waiting, *held]}
    return [r.pod for r in to_retry(pods, claims, [NOTEBOOKS], gpus)]


def test_only_a_filter_verdict_waits_for_an_event() -> None:
    assert turned_away(pod("a", AWAY))
    prebind = {**AWAY, "reason": "SchedulerError", "message": 'running PreBind plugin "DynamicResources": denied'}
    assert not turned_away(pod("b", prebind))  # retried with backoff by the scheduler itself
    assert not turned_away(pod("c", {**AWAY, "message": "0/3 nodes are available: 3 Insufficient cpu."}))
    assert not turned_away(pod("d", AWAY, node="n1"))
    assert not turned_away(pod("e"))


def test_a_pod_turned_away_is_tried_again_when_its_share_fits_now() -> None:
    held = [claim("ds", "big", [("n1", DEVICE)], pods=("big",), consumed="18Gi")]
    assert retries([pod("small", AWAY)], [asks("small", "2Gi")], held) == ["ds/small"]


def test_not_when_the_committed_allocations_leave_no_room_for_it() -> None:
    held = [claim("ds", "big", [("n1", DEVICE)], pods=("big",), consumed="18Gi")]
    assert retries([pod("large", AWAY)], [asks("large", "8Gi")], held) == []


def test_the_request_is_rounded_up_to_the_step_as_the_scheduler_does() -> None:
    held = [claim("ds", "big", [("n1", DEVICE)], pods=("big",), consumed="18Gi")]
    gpus = occupancy(read_pools(published("n1", "l4", 1, [NOTEBOOKS]), held)).gpus
    _, rounded = room_for(gpus, "notebooks", "shared", 2 * 2**30 + 1)
    assert rounded == 3 * 2**30
    # The L4 offers 22.49Gi, 4.49Gi of it free: 4Gi fits, and one byte more is 5Gi, which does not.
    fits = {size: retries([pod("p", AWAY)], [asks("p", size)], held) == ["ds/p"]
            for size in ("4Gi", str(4 * 2**30 + 1))}
    assert fits == {"4Gi": True, str(4 * 2**30 + 1): False}


def test_pods_without_our_claims_or_with_claims_already_allocated_are_left_alone() -> None:
    held = [claim("ds", "big", [("n1", DEVICE)], pods=("big",), consumed="2Gi")]
    other = asks("theirs", "1Gi", device_class="gpu.example.com")
    done = claim("ds", "done", [("n1", DEVICE)], consumed="1Gi", class_name="notebooks.gpuslice.dev")
    assert retries([pod("theirs", AWAY), pod("done", AWAY), pod("unmade", AWAY)], [other, done], held) == []


def test_a_first_available_request_fits_when_one_of_its_options_does() -> None:
    held = [claim("ds", "big", [("n1", DEVICE)], pods=("big",), consumed="18Gi")]  # 4.49Gi free
    either = {"metadata": {"namespace": "ds", "name": "either"}, "spec": {"devices": {"requests": [
        {"name": "gpu", "firstAvailable": [
            {"name": "large", "deviceClassName": "notebooks.gpuslice.dev", "capacity": {"requests": {"memory": "16Gi"}}},
            {"name": "small", "deviceClassName": "notebooks.gpuslice.dev", "capacity": {"requests": {"memory": "2Gi"}}},
        ]}]}}}
    assert retries([pod("either", AWAY)], [either], held) == ["ds/either"]
    neither = {**either, "metadata": {"namespace": "ds", "name": "neither"}, "spec": {"devices": {"requests": [
        {"name": "gpu", "firstAvailable": [
            {"name": "large", "deviceClassName": "notebooks.gpuslice.dev", "capacity": {"requests": {"memory": "16Gi"}}},
        ]}]}}}
    assert retries([pod("neither", AWAY)], [neither], held) == []


def test_every_claim_of_ours_a_pod_waits_for_must_fit() -> None:
    held = [claim("ds", "big", [("n1", DEVICE)], pods=("big",), consumed="18Gi")]
    two = pod("two", AWAY)
    two["spec"]["resourceClaims"] = [{"name": "a", "resourceClaimName": "fits"}, {"name": "b", "resourceClaimName": "not"}]
    assert retries([two], [asks("fits", "2Gi"), asks("not", "8Gi")], held) == []
    two["spec"]["resourceClaims"] = [{"name": "a", "resourceClaimName": "fits"}, {"name": "b", "resourceClaimName": "gone"}]
    assert retries([two], [asks("fits", "2Gi")], held) == []  # a claim not made: not ours to judge


def test_a_claim_with_cel_selectors_is_left_to_the_schedulers_flush() -> None:
    """A selector no device matches (a tenant's poison) would be turned away for ever and 'fit' by
    room: gpuslice does not evaluate CEL, so it never asks for such a pod."""
    held = [claim("ds", "big", [("n1", DEVICE)], pods=("big",), consumed="18Gi")]
    poison = asks("poison", "1Gi")
    poison["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [
        {"cel": {"expression": "device.attributes['gpuslice.dev'].index == 99"}}]
    assert retries([pod("poison", AWAY)], [poison], held) == []


def test_not_when_no_node_with_room_is_one_the_pod_may_go_to() -> None:
    from gpuslice.planning.reads.node_fit import NodeFacts

    held = [claim("ds", "big", [("n1", DEVICE)], pods=("big",), consumed="18Gi")]
    gpus = occupancy(read_pools(published("n1", "l4", 1, [NOTEBOOKS]), held)).gpus
    waiting = [asks("small", "2Gi")]
    claims = {f"ds/{c['metadata']['name']}": c for c in [*waiting, *held]}
    elsewhere = pod("small", AWAY)
    elsewhere["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                                     "values": ["cpu-only"]}]}]}}}
    nodes = {"n1": NodeFacts("n1", {"kubernetes.io/hostname": "n1"})}
    assert to_retry([elsewhere], claims, [NOTEBOOKS], gpus, nodes) == []
    assert [r.pod for r in to_retry([pod("small", AWAY)], claims, [NOTEBOOKS], gpus, nodes)] == ["ds/small"]
    tainted = {"n1": NodeFacts("n1", {}, ({"key": "dedicated", "value": "infra", "effect": "NoSchedule"},))}
    assert to_retry([pod("small", AWAY)], claims, [NOTEBOOKS], gpus, tainted) == []
