"""The defragmenter frees no GPU for a claim that would not be allocated once it is free: refused by
the tenancy rule or the maxMemory webhook, or kept off the GPU's node by the pod's own placement,
or narrowed by selectors it cannot judge. Evicting another tenant's pods for it would be for nothing."""

from __future__ import annotations

from typing import Any

from gpuslice.planning.defrag.model import Plan
from tests.unit.planning.cluster_state import policy_body
from tests.unit.planning.defrag_state import FULL, Fleet

SLICING = {"mode": "memory", "sliceSize": "10G", "allowFullGpu": True}
SINCE = "2026-11-30T00:00:00Z"  # the tenants' quota: before every claim of the fleet


def fleet(*tenants: dict[str, Any], admitted: list[dict[str, Any]] | None = None) -> Fleet:
    """GPU 0 holds one movable pod of team-a, GPUs 1-3 a pod each, so one move frees GPU 0."""
    policy = policy_body("inference", SLICING, tenants=[{"namespace": "team-a"}, *tenants])
    if admitted is not None:
        policy["status"]["admittedTenants"] = admitted
    made = Fleet(policies=[policy])
    for gpu in range(4):
        made.run(gpu)
    for gpu in range(1, 4):
        made.run(gpu)
    return made


def ledger(held: str, limit: str = "100000000000") -> dict[str, Any]:
    return {"spec": {"policy": "inference", "namespace": "team-b", "namespaceUid": "ns-b", "limitBytes": limit},
            "status": {"since": SINCE, "namespaceUid": "ns-b", "heldBytes": held}}


def only(made: Fleet) -> Plan:
    plans = [p for p in made.plans() if p.pod == "team-b/big"]
    assert len(plans) == 1
    return plans[0]


def test_a_tenant_at_its_max_memory_gets_no_move_however_little_its_other_claims_need() -> None:
    """The review's attack: 40G held of 100G, a whole GPU (79.6Gi) asked: the webhook would refuse it."""
    made = fleet({"namespace": "team-b", "maxMemory": "100G"})
    made.ledgers = {("inference", "team-b"): ledger("40000000000")}
    made.wait(namespace="team-b")
    plan = only(made)
    assert (plan.verdict, plan.reason, plan.target) == ("Unsupported", "OverMemory", None)
    assert "maxMemory" in plan.message
    made.ledgers = {("inference", "team-b"): ledger("0")}
    assert only(made).verdict == "Ready"  # with room left, the move is made


def test_a_max_memory_not_in_force_or_unreadable_gets_no_move() -> None:
    made = fleet({"namespace": "team-b", "maxMemory": "100G"})
    made.wait(namespace="team-b")
    plan = only(made)  # no ledger yet: the webhook refuses every allocation of the tenant
    assert (plan.verdict, plan.reason) == ("Unsupported", "NotAdmitted")
    made.ledgers = None
    plan = only(made)
    assert (plan.verdict, plan.reason) == ("Unsupported", "MemoryUnknown")
    assert "could not be read" in plan.message


def test_a_namespace_not_admitted_by_uid_gets_no_move() -> None:
    made = fleet({"namespace": "team-b"}, admitted=[{"namespace": "team-a", "uid": "ns-a"},
                                                   {"namespace": "team-b", "uid": "old-incarnation"}])
    made.namespace_uids = {"team-a": "ns-a", "team-b": "ns-b"}
    made.wait(namespace="team-b")
    plan = only(made)
    assert (plan.verdict, plan.reason) == ("Unsupported", "NotAdmitted")


def counted(since: str, limits: dict[str, Any] | None = None) -> Fleet:
    made = fleet({"namespace": "team-b", "maxFullGpus": 1}, admitted=[
        {"namespace": "team-a", "uid": "ns-a"},
        {"namespace": "team-b", "uid": "ns-b", "limits": limits or {"maxFullGpus": 1}, "since": since,
         "classes": ["inference.gpuslice.dev", FULL]}])
    made.namespace_uids = {"team-a": "ns-a", "team-b": "ns-b"}
    made.wait(namespace="team-b")
    return made


def test_a_counted_tenant_gets_a_move_only_for_a_claim_made_under_its_limits_in_force() -> None:
    assert only(counted(SINCE)).verdict == "Ready"
    plan = only(counted("2026-12-01T02:00:00Z"))  # the quota is younger than the claim (made at 01:00)
    assert (plan.verdict, plan.reason) == ("Unsupported", "MadeBeforeQuota")
    plan = only(counted(SINCE, {"maxFullGpus": 2}))  # the spec says 1: the record is not in force
    assert (plan.verdict, plan.reason) == ("Unsupported", "LimitsNotInForce")


def test_a_claim_with_selectors_gets_no_move_and_is_told_why() -> None:
    made = fleet({"namespace": "team-b"})
    made.wait(namespace="team-b")
    made.claims[-1]["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [
        {"cel": {"expression": "device.attributes['gpuslice.dev'].index == 99"}}]
    plan = only(made)
    assert (plan.verdict, plan.reason) == ("Unsupported", "Selectors")
    assert "CEL selectors" in plan.message


def test_a_pod_whose_affinity_or_tolerations_keep_it_off_the_gpu_nodes_gets_no_move() -> None:
    made = fleet({"namespace": "team-b"})
    made.wait(namespace="team-b")
    made.pods[-1]["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                                     "values": ["cpu-only"]}]}]}}}
    plan = only(made)
    assert (plan.verdict, plan.reason) == ("Unsupported", "NodeFit")
    assert "required node affinity" in plan.message
    made.pods[-1]["spec"].pop("affinity")
    made.node_taints = ({"key": "dedicated", "value": "infra", "effect": "NoSchedule"},)
    plan = only(made)
    assert (plan.verdict, plan.reason) == ("Unsupported", "NodeFit")
    assert "dedicated=infra:NoSchedule" in plan.message
    made.pods[-1]["spec"]["tolerations"] = [{"key": "dedicated", "operator": "Exists"}]
    assert only(made).verdict == "Blocked"  # now it may go there: but the moved pods may not (next test)


def test_a_pod_is_moved_only_where_its_replacement_may_go() -> None:
    made = fleet({"namespace": "team-b"})
    made.wait(namespace="team-b")
    assert only(made).verdict == "Ready"
    for pod in made.pods[:-1]:  # every running pod: its replacement would not tolerate the node
        pod["spec"]["nodeSelector"] = {"pool": "elsewhere"}
    plan = only(made)
    assert plan.verdict == "Blocked"
    assert {b.code for o in plan.alternatives for b in o.blockers} == {"NowhereToGo"}


def test_a_pod_whose_claim_has_selectors_is_not_moved() -> None:
    made = fleet({"namespace": "team-b"})
    made.wait(namespace="team-b")
    first = made.claims[0]  # the one pod on GPU 0
    first["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [{"cel": {"expression": "true"}}]
    plan = only(made)
    assert plan.target is not None
    assert plan.target.index != 0
    blocked = next(o for o in plan.alternatives if o.index == 0)
    assert [b.code for b in blocked.blockers] == ["Selectors"]
