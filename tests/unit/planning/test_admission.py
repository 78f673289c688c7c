"""gpuslice's static admission policies: the committed manifest is what the code generates, and
it names the controller where it must. What they admit is tested against the real apiserver
(tests/cluster/controller/test_tenancy.py and test_rbac.py)."""

from __future__ import annotations

from pathlib import Path

import yaml

from gpuslice.planning.admission import CONTROLLER_USER, admission_yaml, static_manifests

COMMITTED = Path(__file__).resolve().parents[3] / "manifests" / "admission.yaml"


def test_committed_admission_manifest_is_not_stale() -> None:
    assert COMMITTED.read_text() == admission_yaml(), "manifests/admission.yaml is stale: run `make crds`"


def test_one_tenancy_policy_for_every_gpuslice_policy() -> None:
    tenancy, binding, *_ = static_manifests()
    assert tenancy["spec"]["paramKind"] == {"apiVersion": "gpuslice.dev/v1alpha1", "kind": "GpuSlicePolicy"}
    assert binding["spec"]["paramRef"] == {"selector": {}, "parameterNotFoundAction": "Allow"}
    rules = tenancy["spec"]["matchConstraints"]["resourceRules"]
    # Claims and templates when made (their spec is immutable), and the allocation write.
    assert [(r["operations"], r["resources"]) for r in rules] == [
        (["CREATE"], ["resourceclaims", "resourceclaimtemplates"]), (["UPDATE"], ["resourceclaims/status"])]


def test_guard_and_write_limits_name_the_controller_and_another_identity_can_be_generated() -> None:
    _, _, guard, _, writes, *_ = static_manifests()
    assert f"request.userInfo.username == '{CONTROLLER_USER}'" in guard["spec"]["validations"][0]["expression"]
    assert guard["spec"]["matchConstraints"]["resourceRules"][0]["resources"] == [
        "namespaces", "namespaces/status", "namespaces/finalize"]
    assert writes["spec"]["matchConditions"][0]["expression"] == f"request.userInfo.username == '{CONTROLLER_USER}'"
    other = yaml.safe_load_all(admission_yaml("system:serviceaccount:ops:gpuslice"))
    assert "system:serviceaccount:ops:gpuslice" in str(list(other))
