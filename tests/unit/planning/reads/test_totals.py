"""Use against limit per policy and per tenant, in devices and bytes."""

from __future__ import annotations

from gpuslice.inventory.catalog import MODELS
from gpuslice.planning.reads.status_report import Snapshot, status_report
from tests.unit.planning.cluster_state import INFERENCE, claim, node_body, policy_body, published, tag, taint

H100 = MODELS["h100-80gb"].memory
G = 10**9


def test_a_tenant_counts_slices_and_whole_gpus_in_devices_and_bytes() -> None:
    t0, t1 = tag("n1", index=0), tag("n1", index=1)
    claims = [claim("team-a", "a0", [("n1", f"{t0}-inference-10g-0")]),
              claim("team-a", "a1", [("n1", f"{t0}-inference-10g-1")]),
              claim("team-a", "big", [("n1", f"{t1}-inference-full")]),
              claim("team-b", "b0", [("n1", f"{t0}-inference-10g-2")])]
    report = status_report(Snapshot([INFERENCE], published("n1", "h100-80gb", 2, [INFERENCE]), claims,
                                    [node_body("n1", "h100-80gb", 2)]))
    [policy] = report.policies
    assert (policy.published, policy.allocated, policy.free, policy.nodes, policy.gpus) == (18, 4, 14, 1, 2)
    a, b = policy.tenants
    assert (a.namespace, a.allocated, a.limit, a.allocated_bytes, a.limit_bytes) == (
        "team-a", 3, 9, 2 * 10 * G + H100, 8 * 10 * G + H100)
    assert [(k.kind, k.allocated, k.limit) for k in a.kinds] == [("slice", 2, 8), ("full", 1, 1)]
    assert (b.allocated, b.limit, b.allocated_bytes, b.limit_bytes) == (1, 4, 10 * G, 40 * G)
    assert not a.over
    assert not b.over


def test_a_tenant_over_a_lowered_limit_is_marked() -> None:
    lowered = policy_body("inference", {"mode": "memory", "sliceSize": "10G"},
                          tenants=[{"namespace": "team-b", "maxSlices": 1}])
    t = tag("n1")
    claims = [claim("team-b", f"b{i}", [("n1", f"{t}-inference-10g-{i}")]) for i in range(3)]
    [policy] = status_report(Snapshot([lowered], published("n1", "h100-80gb", 1, [lowered]), claims)).policies
    assert policy.tenants[0].over


def test_tenants_across_policies_add_up_and_an_unlimited_one_has_no_limit() -> None:
    other = policy_body("batch", {"mode": "memory", "sliceSize": "20G"}, created="2026-11-29T11:00:00Z",
                        tenants=[{"namespace": "team-a"}], claimTemplateName="batch")
    report = status_report(Snapshot([INFERENCE, other], published("n1", "h100-80gb", 1, [INFERENCE, other])))
    team_a = next(t for t in report.tenants if t.namespace == "team-a")
    assert (team_a.policies, team_a.limit, team_a.limit_bytes) == (("batch", "inference"), None, None)


def test_taint_reasons_and_foreign_claims_per_policy() -> None:
    t = tag("n1")
    slices = published("n1", "h100-80gb", 1, [INFERENCE])
    taint(slices, {f"{t}-inference-10g-{i}" for i in range(3)}, "gpuslice.dev/reconfiguring")
    report = status_report(Snapshot([INFERENCE], slices, [claim("gone", "old", [("n1", f"{t}-inference-10g-7")])]))
    [policy] = report.policies
    assert policy.taint_reasons == (("reconfiguring", 3),)
    assert policy.foreign_claims == ("gone/old",)


def test_a_policy_that_does_not_parse_is_listed_with_its_problem() -> None:
    broken = policy_body("broken", {"mode": "memory"})  # no sliceSize
    [policy] = status_report(Snapshot([broken])).policies
    assert "sliceSize" in policy.problem
