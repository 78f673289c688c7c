"""Why a pod waits for its GPU, in the platform's terms."""

from __future__ import annotations

from typing import Any

from gpuslice.planning.reads.pending import Diagnosis, Facts, diagnose
from gpuslice.planning.reads.status_report import Snapshot, status_report
from tests.unit.planning.cluster_state import INFERENCE, claim, node_body, overusing, published, tag, taint

NODES = [node_body("n1", "h100-80gb", 1)]


def pod(namespace: str, name: str, *, template: str | None = None, claim_name: str | None = None,
        made: str | None = None, limits: dict[str, Any] | None = None, phase: str = "Pending") -> dict[str, Any]:
    claims = []
    if template:
        claims.append({"name": "gpu", "resourceClaimTemplateName": template})
    if claim_name:
        claims.append({"name": "gpu", "resourceClaimName": claim_name})
    status: dict[str, Any] = {"phase": phase}
    if made:
        status["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": made}]
    return {"metadata": {"namespace": namespace, "name": name, "uid": f"uid-{name}"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": limits or {}}}], "resourceClaims": claims},
            "status": status}


def template(name: str, device_class: str) -> dict[str, Any]:
    return {"metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]}}}}


def unallocated(namespace: str, name: str, device_class: str, **request: Any) -> dict[str, Any]:
    return {"metadata": {"namespace": namespace, "name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class,
                                                                           **request}}]}}}


def quota(policy: str, device_class: str, used: int, hard: int) -> dict[str, Any]:
    key = f"{device_class}.deviceclass.resource.k8s.io/devices"
    return {"metadata": {"name": f"gpuslice-{policy}"}, "status": {"hard": {key: str(hard)}, "used": {key: str(used)}}}


LIMITS = ("maxSlices", "maxFullGpus", "maxMigDevices", "maxMemory")
QUOTA_SINCE = "2026-01-01T00:00:00Z"


def admitted(body: dict[str, Any], *pairs: tuple[str, str]) -> dict[str, Any]:
    """The record the controller writes: a limited tenant's limits as its spec says, both classes
    counted, its quota made before any claim here."""
    def record(namespace: str, uid: str) -> dict[str, Any]:
        tenant = next(t for t in body["spec"].get("tenants") or [] if t["namespace"] == namespace)
        limits = {k: tenant[k] for k in LIMITS if k in tenant}
        if not limits:
            return {"namespace": namespace, "uid": uid}
        return {"namespace": namespace, "uid": uid, "limits": limits, "since": QUOTA_SINCE,
                "classes": ["inference.gpuslice.dev", "full.inference.gpuslice.dev"]}

    body = {**body, "status": {**body["status"], "admittedTenants": [record(n, u) for n, u in pairs],
                               "deviceClasses": [{"kind": "slice", "name": "inference.gpuslice.dev"},
                                                 {"kind": "full", "name": "full.inference.gpuslice.dev"}]}}
    return body


POLICY = admitted(INFERENCE, ("team-a", "ns-a"), ("team-b", "ns-b"))


def run(facts: Facts, slices: list[dict[str, Any]] | None = None, claims: list[dict[str, Any]] | None = None,
        policies: list[dict[str, Any]] | None = None) -> Diagnosis:
    policies = policies or [POLICY]
    snapshot = Snapshot(policies, slices if slices is not None else published("n1", "h100-80gb", 1, [POLICY]),
                        list(claims or []) + list(facts.claims.values()), NODES)
    report = status_report(snapshot)
    return diagnose(facts, policies, report.policies, report.map)


def codes(diagnosis: Diagnosis) -> list[str]:
    return [f.code for f in diagnosis.blocking]


def test_not_a_tenant_names_the_policy_and_its_tenants() -> None:
    facts = Facts("intruder", pod("intruder", "p", template="mine"),
                  templates={"mine": template("mine", "inference.gpuslice.dev")}, namespace_uid="ns-x")
    diagnosis = run(facts)
    assert codes(diagnosis)[0] == "NotATenant"
    assert "not a tenant of GpuSlicePolicy inference (tenants: team-a, team-b)" in diagnosis.findings[0].message


def test_over_the_limit_says_by_how_much_in_devices_and_memory() -> None:
    events = [{"involvedObject": {"name": "p4"}, "type": "Warning", "reason": "FailedResourceClaimCreation",
               "message": "PodResourceClaim gpu: ... is forbidden: exceeded quota: gpuslice-inference",
               "lastTimestamp": "2026-12-01T00:00:00Z"}]
    facts = Facts("team-b", pod("team-b", "p4", template="gpu-slice"),
                  templates={"gpu-slice": template("gpu-slice", "inference.gpuslice.dev")},
                  quotas=[quota("inference", "inference.gpuslice.dev", 4, 4)], namespace_uid="ns-b", events=events)
    diagnosis = run(facts)
    assert codes(diagnosis) == ["OverLimit", "AdmissionDenied"]
    message = diagnosis.findings[0].message
    assert "team-b may hold 4 x slice of inference (40G) and its claims already count 4" in message
    assert "1 over the limit (10G of GPU memory)" in message


def test_a_tenant_whose_quota_is_not_in_place_waits() -> None:
    facts = Facts("team-a", pod("team-a", "p", template="gpu-slice"),
                  templates={"gpu-slice": template("gpu-slice", "inference.gpuslice.dev")}, namespace_uid="new-uid")
    assert "NotAdmitted" in codes(run(facts))


def test_no_free_slice_anywhere_shows_the_largest_free_device() -> None:
    t = tag("n1")
    holders = [claim("team-a", f"c{i}", [("n1", f"{t}-inference-10g-{i}")]) for i in range(8)]
    waiting = unallocated("team-b", "mine", "full.inference.gpuslice.dev")
    facts = Facts("team-b", pod("team-b", "p", claim_name="mine"), claims={"mine": waiting}, namespace_uid="ns-b")
    diagnosis = run(facts, claims=holders)
    assert codes(diagnosis) == ["NoFreeDevice"]
    assert diagnosis.findings[0].message \
        == "No free whole GPU of inference on any of its 1 nodes (1 asked, 0 free). Nothing of inference is free."


def test_the_largest_free_one_when_the_size_asked_is_not_there() -> None:
    t = tag("n1")
    holders = [claim("team-a", "c0", [("n1", f"{t}-inference-10g-0")])]
    waiting = unallocated("team-b", "mine", "full.inference.gpuslice.dev")
    facts = Facts("team-b", pod("team-b", "p", claim_name="mine"), claims={"mine": waiting}, namespace_uid="ns-b")
    [finding] = run(facts, claims=holders).blocking
    assert finding.message.endswith("The largest free one: slice (10G) on n1 GPU 0.")


def test_slices_that_are_there_but_tainted_are_said_to_be() -> None:
    t = tag("n1")
    slices = published("n1", "h100-80gb", 1, [POLICY])
    taint(slices, {d["name"] for s in slices for d in s["spec"].get("devices") or []},
          "gpuslice.dev/reconfiguring")
    waiting = unallocated("team-b", "mine", "inference.gpuslice.dev")
    facts = Facts("team-b", pod("team-b", "p", claim_name="mine"), claims={"mine": waiting}, namespace_uid="ns-b")
    diagnosis = run(facts, slices=slices)
    assert codes(diagnosis) == ["NoFreeDevice", "KeptOff"]
    assert "8 x slice of inference would fit but are kept off: reconfiguring (n1 GPU 0)" in diagnosis.blocking[1].message
    assert t  # the GPU the slices stand on


def test_an_allocated_claim_waits_on_its_node() -> None:
    t = tag("n1")
    mine = claim("team-a", "mine", [("n1", f"{t}-inference-10g-0")], class_name="inference.gpuslice.dev")
    events = [{"involvedObject": {"name": "p"}, "type": "Warning", "reason": "FailedPrepareDynamicResources",
               "message": "DRA driver gpu.gpuslice.dev is not registered", "lastTimestamp": "x"}]
    facts = Facts("team-a", pod("team-a", "p", template="gpu-slice", made="mine"), claims={"mine": mine},
                  events=events, namespace_uid="ns-a")
    diagnosis = run(facts)
    assert codes(diagnosis) == []
    assert [f.code for f in diagnosis.findings] == ["Allocated", "Event", "WaitingOnNode"]


def test_why_names_the_neighbour_that_uses_more_than_its_slice() -> None:
    t = tag("n1")
    mine = claim("team-a", "mine", [("n1", f"{t}-inference-10g-0")], pods=("p",), class_name="inference.gpuslice.dev")
    greedy = overusing(claim("team-b", "greedy", [("n1", f"{t}-inference-10g-1")], pods=("g",),
                             class_name="inference.gpuslice.dev"),
                       "pod team-b/g uses 14Gi of GPU memory on GPU ..., more than the 10G its claims were allocated")
    elsewhere = claim("team-b", "calm", [("n1", f"{t}-inference-10g-2")], pods=("c",))
    facts = Facts("team-a", pod("team-a", "p", claim_name="mine", phase="Running"), claims={"mine": mine},
                  namespace_uid="ns-a")
    diagnosis = run(facts, claims=[greedy, elsewhere])
    [neighbour] = [f for f in diagnosis.findings if f.code == "NeighbourOverusing"]
    assert "n1 GPU 0" in neighbour.message
    assert "pod team-b/g uses 14Gi of GPU memory" in neighbour.message
    assert [f.code for f in diagnosis.findings][:2] == ["NotPending", "NeighbourOverusing"]

    # The overuser asking why: it is told it is the one.
    facts = Facts("team-b", pod("team-b", "g", claim_name="greedy", phase="Running"), claims={"greedy": greedy})
    assert "Overusing" in [f.code for f in run(facts, claims=[mine]).findings]


def test_the_extended_resource_way_is_read_as_the_policys_class() -> None:
    ext = {**POLICY, "spec": {**POLICY["spec"], "extendedResourceName": "example.com/gpu-slice"}}
    facts = Facts("intruder", pod("intruder", "p", limits={"example.com/gpu-slice": 1}), namespace_uid="ns-x")
    diagnosis = run(facts, policies=[ext])
    assert [r.device_class for r in diagnosis.requests] == ["inference.gpuslice.dev"]
    assert codes(diagnosis) == ["NotATenant"]


def test_a_pod_that_asks_for_no_gpuslice_device_says_so() -> None:
    facts = Facts("team-a", pod("team-a", "p", template="other"),
                  templates={"other": template("other", "gpu.nvidia.com")})
    assert [f.code for f in run(facts).findings] == ["NotGpuslice"]


def test_missing_subject() -> None:
    assert codes(run(Facts("team-a", None, claim_name="nope"))) == ["NotFound"]
