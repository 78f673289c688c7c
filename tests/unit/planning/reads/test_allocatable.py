"""What the tenancy rule and the maxMemory webhook would refuse at a made claim's allocation."""

from __future__ import annotations

from typing import Any

from gpuslice.planning.reads.allocatable import admission
from gpuslice.planning.reads.findings import Request
from tests.unit.planning.cluster_state import policy_body

FULL = Request("big-gpu", "gpu", "full.p.gpuslice.dev")
SINCE = "2026-12-01T00:00:00Z"


def admitted(tenant: dict[str, Any], record: dict[str, Any] | None) -> dict[str, Any]:
    body = policy_body("p", {"mode": "memory", "sliceSize": "10G", "allowFullGpu": True}, tenants=[tenant])
    body["status"]["admittedTenants"] = [record] if record else []
    body["status"]["classesInForce"] = [{"name": "full.p.gpuslice.dev", "kind": "full", "memory": "80Gi",
                                         "leastMemory": "80Gi"}]
    return body


def ledger(held: int, uid: str = "ns-b") -> dict[str, Any]:
    return {"spec": {"namespaceUid": "ns-b", "limitBytes": str(100 * 2**30)},
            "status": {"since": SINCE, "namespaceUid": uid, "heldBytes": str(held)}}


def test_max_memory_judged_from_the_ledger_and_the_class_in_force() -> None:
    body = admitted({"namespace": "b", "maxMemory": "100Gi"}, {"namespace": "b", "uid": "ns-b",
                                                             "limits": {"maxMemory": "100Gi"}})
    ok = admission(FULL, body, "b", "ns-b", "2026-12-02T00:00:00Z", ledger(20 * 2**30))
    assert ok.refused is None
    assert ok.room is not None
    assert ok.room.left == 80 * 2**30
    over = admission(FULL, body, "b", "ns-b", "2026-12-02T00:00:00Z", ledger(21 * 2**30))
    assert over.refused is not None
    assert over.refused.code == "OverMemory"
    stale = admission(FULL, body, "b", "ns-b", "", ledger(0, uid="old"))  # it counted another incarnation
    assert stale.refused is not None
    assert stale.refused.code == "NotAdmitted"
    unread = admission(FULL, body, "b", "ns-b", "", None, ledgers_read=False)
    assert unread.refused is not None
    assert unread.refused.code == "MemoryUnknown"


def test_the_record_refuses_what_the_tenancy_rule_refuses_at_allocation() -> None:
    record = {"namespace": "b", "uid": "ns-b", "limits": {"maxFullGpus": 1}, "since": SINCE,
              "classes": ["full.p.gpuslice.dev"]}
    body = admitted({"namespace": "b", "maxFullGpus": 1}, record)
    assert admission(FULL, body, "b", "ns-b", "2026-12-02T00:00:00Z", None).refused is None
    cases = {"MadeBeforeQuota": (body, "ns-b", SINCE),  # in the quota's second: not after it
             "NotAdmitted": (body, "ns-other", "2026-12-02T00:00:00Z"),
             "LimitsNotInForce": (admitted({"namespace": "b", "maxFullGpus": 2}, record), "ns-b", "2026-12-02T00:00:00Z"),
             "ClassNotInForce": (admitted({"namespace": "b", "maxFullGpus": 1}, {**record, "classes": ["x"]}), "ns-b",
                                 "2026-12-02T00:00:00Z")}
    for code, (judged, uid, created) in cases.items():
        refused = admission(FULL, judged, "b", uid, created, None).refused
        assert refused is not None, code
        assert refused.code == code
    assert admission(FULL, body, "c", "ns-c", "", None).refused is not None  # not a tenant
