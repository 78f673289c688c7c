"""gpuslice's static admission policies: the committed manifest is what the code generates, and
it names the controller where it must. What they admit is tested against the real apiserver
(tests/cluster/controller/test_tenancy.py and test_rbac.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gpuslice.planning.cluster.admission import (
    ADMIN_LABEL_GUARD,
    CONTROLLER_USER,
    CONTROLLER_WRITES,
    admission_yaml,
    static_manifests,
)
from gpuslice.planning.cluster.memory_rule import memory_webhook, memory_webhook_yaml
from gpuslice.planning.cluster.tenancy_rule import judged_namespaces, other_namespaces

MANIFESTS = Path(__file__).resolve().parents[4] / "manifests"
COMMITTED = MANIFESTS / "admission.yaml"


def _policies() -> dict[str, dict[str, Any]]:
    """Every ValidatingAdmissionPolicy gpuslice installs: the generated ones and the agent's."""
    found = [d for d in yaml.safe_load_all((MANIFESTS / "agent-rbac.yaml").read_text()) if d]
    found += static_manifests()
    return {d["metadata"]["name"]: d for d in found if d["kind"] == "ValidatingAdmissionPolicy"}


def test_committed_admission_manifest_is_not_stale() -> None:
    assert COMMITTED.read_text() == admission_yaml(), "manifests/admission.yaml is stale: run `make crds`"
    assert (MANIFESTS / "memory-webhook.yaml").read_text() == memory_webhook_yaml(), (
        "manifests/memory-webhook.yaml is stale: run `make crds`")


def test_the_memory_webhook_judges_only_claims_of_max_memory_tenants_and_fails_closed() -> None:
    """Only claims made and allocations written, of gpuslice's classes, in the namespaces labelled as
    maxMemory tenants (and its probe in gpuslice-system, where no other claim reaches it): every other
    claim in the cluster never waits on it."""
    [hook] = memory_webhook()["webhooks"]
    assert hook["namespaceSelector"] == {"matchLabels": {"gpuslice.dev/memory-limit": "judged"}}
    assert hook["failurePolicy"] == "Fail"
    assert hook["sideEffects"] == "NoneOnDryRun"
    assert [(r["operations"], r["resources"]) for r in hook["rules"]] == [
        (["CREATE"], ["resourceclaims"]), (["UPDATE"], ["resourceclaims/status"])]
    conditions = {c["name"]: c["expression"] for c in hook["matchConditions"]}
    assert "endsWith('.gpuslice.dev')" in conditions["names-a-gpuslice-class-or-is-the-probe"]
    assert "request.namespace != 'gpuslice-system'" in conditions["names-a-gpuslice-class-or-is-the-probe"]
    assert hook["clientConfig"]["service"] == {"namespace": "gpuslice-system", "name": "gpuslice-webhook",
                                                "path": "/validate/maxmemory", "port": 443}
    assert memory_webhook(url="https://127.0.0.1:9443/x")["webhooks"][0]["clientConfig"] == {
        "url": "https://127.0.0.1:9443/x"}


def test_one_tenancy_policy_for_every_gpuslice_policy() -> None:
    tenancy, binding, *_ = static_manifests()
    assert tenancy["spec"]["paramKind"] == {"apiVersion": "gpuslice.dev/v1alpha1", "kind": "GpuSlicePolicy"}
    assert binding["spec"]["paramRef"] == {"selector": {}, "parameterNotFoundAction": "Allow"}
    rules = tenancy["spec"]["matchConstraints"]["resourceRules"]
    # Claims and templates when made (their spec is immutable), and the allocation write.
    assert [(r["operations"], r["resources"]) for r in rules] == [
        (["CREATE"], ["resourceclaims", "resourceclaimtemplates"]), (["UPDATE"], ["resourceclaims/status"])]


def test_guard_and_write_limits_name_the_controller_and_another_identity_can_be_generated() -> None:
    by_name = {m["metadata"]["name"]: m for m in static_manifests() if m["kind"] == "ValidatingAdmissionPolicy"}
    guard, writes = by_name[ADMIN_LABEL_GUARD], by_name[CONTROLLER_WRITES]
    assert f"request.userInfo.username == '{CONTROLLER_USER}'" in guard["spec"]["validations"][0]["expression"]
    assert guard["spec"]["matchConstraints"]["resourceRules"][0]["resources"] == [
        "namespaces", "namespaces/status", "namespaces/finalize"]
    assert writes["spec"]["matchConditions"][0]["expression"] == f"request.userInfo.username == '{CONTROLLER_USER}'"
    other = yaml.safe_load_all(admission_yaml("system:serviceaccount:ops:gpuslice"))
    assert "system:serviceaccount:ops:gpuslice" in str(list(other))


def test_every_admission_policy_judges_only_what_concerns_gpuslice() -> None:
    """Every rule has match conditions, so nothing else in the cluster is evaluated. A rule with a
    parameter also confines itself to the labelled namespaces: the API server resolves parameters
    before match conditions, so it would refuse everything it matches while its parameter kind is
    not served (the CRD deleted, or not yet learnt after a restart)."""
    policies = _policies()
    assert len(policies) >= 7, sorted(policies)
    for name, policy in policies.items():
        spec = policy["spec"]
        assert spec.get("matchConditions"), f"{name} judges everything it matches: give it matchConditions"
        if "paramKind" in spec:
            assert spec["matchConstraints"].get("namespaceSelector") == judged_namespaces(), (
                f"{name} has a parameter: it must judge only namespaces labelled as gpuslice.dev/tenancy=judged")
            assert all(r["resources"] != ["*"] for r in spec["matchConstraints"]["resourceRules"]), name


def test_the_tenancy_rule_and_the_non_tenants_rule_split_every_namespace_between_them() -> None:
    policies = _policies()
    tenancy, gate = policies["gpuslice-tenancy"]["spec"], policies["gpuslice-non-tenants"]["spec"]
    assert "paramKind" not in gate
    assert tenancy["matchConstraints"]["namespaceSelector"] == {"matchLabels": {"gpuslice.dev/tenancy": "judged"}}
    # NotIn matches a namespace without the label too: together they select every namespace once.
    assert gate["matchConstraints"]["namespaceSelector"] == other_namespaces() == {"matchExpressions": [
        {"key": "gpuslice.dev/tenancy", "operator": "NotIn", "values": ["judged"]}]}
    assert tenancy["matchConstraints"]["resourceRules"] == gate["matchConstraints"]["resourceRules"]
    assert tenancy["matchConditions"] == gate["matchConditions"]
    assert [v["expression"] for v in gate["validations"]] == ["false"]


def test_the_controller_namespace_is_judged_by_the_rules_with_parameters() -> None:
    """The probes (the controller's tenancy and maxMemory webhook probes, the agents' drain probe)
    are made there."""
    for file in ("controller-rbac.yaml", "agent-rbac.yaml"):
        namespace = next(d for d in yaml.safe_load_all((MANIFESTS / file).read_text()) if d and d["kind"] == "Namespace")
        assert namespace["metadata"]["labels"] == {"gpuslice.dev/tenancy": "judged",
                                                   "gpuslice.dev/memory-limit": "judged"}, file
