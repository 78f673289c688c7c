"""gpuslice-policy-status: every field of a policy's status is guarded but the moves, so a field
added to the status model is guarded without anyone remembering to; the controller alone is spared.
What it admits is tested against the real API server (tests/cluster/controller/test_policy_status_writers.py)."""

from __future__ import annotations

from gpuslice.api.status import DefragmentationStatus, GpuSlicePolicyStatus
from gpuslice.planning.cluster.admission import CONTROLLER_USER, static_manifests
from gpuslice.planning.cluster.policy_status_rule import POLICY_STATUS, guarded_fields, policy_status_guard


def test_every_field_of_the_status_but_the_moves_is_guarded() -> None:
    guarded = {path for path, _ in guarded_fields()}
    for name, field in GpuSlicePolicyStatus.model_fields.items():
        if name != "defragmentation":
            assert field.alias in guarded, field.alias
    for name, field in DefragmentationStatus.model_fields.items():
        assert (f"defragmentation.{field.alias}" in guarded) == (name != "in_flight"), field.alias
    changed = next(v for v in policy_status_guard(CONTROLLER_USER)["spec"]["variables"] if v["name"] == "changed")
    for path, listed in guarded_fields():
        assert f"['status.{path}']" in changed["expression"], path
        assert (f"object.?status.?{path.replace('.', '.?')}.orValue([])" in changed["expression"]) == listed, path


def test_it_spares_only_the_controller_and_refuses_what_it_judges() -> None:
    manifests = static_manifests("system:serviceaccount:ops:gpuslice")
    [rule] = [m for m in manifests if m["kind"] == "ValidatingAdmissionPolicy" and m["metadata"]["name"] == POLICY_STATUS]
    binding = [m for m in manifests if m["kind"].endswith("Binding") and m["spec"]["policyName"] == POLICY_STATUS]
    assert rule["spec"]["failurePolicy"] == "Fail"
    assert rule["spec"]["matchConditions"] == [{
        "name": "not-the-gpuslice-controller",
        "expression": "request.userInfo.username != 'system:serviceaccount:ops:gpuslice'"}]
    [resources] = rule["spec"]["matchConstraints"]["resourceRules"]
    assert (resources["resources"], resources["operations"]) == (["gpuslicepolicies/status"], ["UPDATE"])
    assert [b["spec"]["validationActions"] for b in binding] == [["Deny"]]
    moves = rule["spec"]["validations"][-2]["expression"]
    assert "o == n" in moves
    assert "'Requested'" in moves
    assert "evicted" in moves
    bounded = rule["spec"]["validations"][-1]["expression"]
    assert "o == n" in bounded, "a move already recorded is judged no more"
    for part in ("n.node in object.?status.?selectedNodes", "n.pod.namespace == n.claim.namespace",
                 "t.namespace == n.claim.namespace", "t.namespace == v.namespace",
                 "timestamp(n.started) < timestamp(n.expires)", "<= duration('3600s')"):
        assert part in bounded, part
