"""A policy's agent view carries what the agents' planner reads and nothing that changes as pods
are bound or tenants come and go: the view of a policy whose status counts changed, or whose
tenants did, is the same object, so the controller writes nothing and no agent hears of it."""

from __future__ import annotations

import copy
from typing import Any

from gpuslice.agent.publisher import sort_policies
from gpuslice.agent.watches import planned_from
from gpuslice.api.agent_view import policy_of, view_of
from gpuslice.api.status import DefragMove, ObjectRef
from tests import builders

MOVE = DefragMove(id="d-1", node="n1", gpu="GPU-1", gpu_tag="gpu-1", device="gpu-1-full",
                  claim=ObjectRef(namespace="a", name="big", uid="u-claim"), pod=ObjectRef(namespace="a", name="p"),
                  started="2026-12-01T00:00:00Z", expires="2026-12-01T00:05:00Z",
                  ).model_dump(by_alias=True, exclude_none=True, mode="json")


def live(**status: Any) -> dict[str, Any]:
    body = builders.policy("p", {"mode": "memory", "sliceSize": "10G"}, generation=1, uid="u-p", node=builders.NODE,
                           tenants=["a", "b"], judged=True,
                           taints=[{"key": "gpuslice.dev/maintenance", "value": "x", "effect": "NoSchedule"}])
    body["metadata"]["resourceVersion"] = "7"
    body["status"].update({"slices": {"published": 8, "allocated": 1}, "nodes": 1, "selectedNodes": ["n1"],
                           "tenants": [{"namespace": "a", "allocated": 1}], "admittedTenants": [
                               {"namespace": "a", "uid": "uid-a"}], **status})
    return body


def test_the_view_is_what_the_planner_reads_and_nothing_that_grows_with_pods_or_tenants() -> None:
    before = live()
    bound = copy.deepcopy(before)
    bound["status"]["slices"]["allocated"] = 2
    bound["status"]["tenants"][0]["allocated"] = 2
    bound["metadata"]["resourceVersion"] = "8"
    assert view_of(bound) == view_of(before), "a bound pod changes no view"
    tenant = copy.deepcopy(before)
    tenant["spec"]["tenants"].append({"namespace": "c"})
    tenant["metadata"]["generation"] = 2
    tenant["status"]["observedGeneration"] = 2
    assert view_of(tenant)["spec"]["spec"] == view_of(before)["spec"]["spec"]
    assert "tenants" not in str(view_of(before)), "nothing of the tenants reaches the agents"
    edited = copy.deepcopy(before)
    edited["spec"]["slicing"]["sliceSize"] = "20G"
    assert view_of(edited) != view_of(before)
    judged = copy.deepcopy(before)
    next(c for c in judged["status"]["conditions"] if c["type"] == "Valid")["status"] = "False"
    assert view_of(judged) != view_of(before)
    moving = live(defragmentation={"inFlight": [MOVE]})
    assert view_of(moving)["spec"]["inFlight"] == [MOVE]
    going = copy.deepcopy(before)
    going["metadata"]["deletionTimestamp"] = "2026-12-06T00:00:00Z"
    assert view_of(going) != view_of(before)


def test_the_agent_plans_from_a_view_as_it_planned_from_the_policy() -> None:
    policy = live(defragmentation={"inFlight": [MOVE]})
    view = view_of(policy)
    view["metadata"]["resourceVersion"] = "9"
    rebuilt = policy_of(view)
    assert planned_from(rebuilt) == planned_from({**policy, "spec": {k: v for k, v in policy["spec"].items()
                                                                      if k != "tenants"}})
    assert rebuilt["metadata"]["resourceVersion"] == "9"
    assert rebuilt["metadata"]["uid"] == policy["metadata"]["uid"]
    [planned] = sort_policies([rebuilt]).plannable
    [direct] = sort_policies([policy]).plannable
    assert planned.spec.slicing == direct.spec.slicing
    assert planned.spec.taints == direct.spec.taints
    assert planned.spec.node_selector == direct.spec.node_selector
    assert (planned.metadata.creation_timestamp, planned.metadata.generation) == (
        direct.metadata.creation_timestamp, direct.metadata.generation)
    unjudged = copy.deepcopy(policy)
    unjudged["metadata"]["generation"] = 2
    assert sort_policies([policy_of(view_of(unjudged))]).frozen == {
        "p": "generation 2 is not validated by the controller yet"}
