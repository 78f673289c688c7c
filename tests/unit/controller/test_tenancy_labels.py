"""The tenancy label goes on exactly the namespaces some policy names and the controller's own
(what it does against a real API server: tests/cluster/install/test_scoped_admission.py)."""

from __future__ import annotations

from typing import Any

from gpuslice.controller.admin_access import NamespaceView
from gpuslice.controller.tenancy_labels import named_namespaces, plan_tenancy_labels


def _policy(tenants: list[str], admins: list[str] = (), deleting: bool = False) -> dict[str, Any]:  # type: ignore[assignment]
    meta: dict[str, Any] = {"name": "p"}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-02T00:00:00Z"
    return {"metadata": meta, "spec": {"tenants": [{"namespace": t} for t in tenants],
                                       "adminAccess": {"namespaces": list(admins)}}}


def _ns(judged: bool, active: bool = True) -> NamespaceView:
    labels = {"gpuslice.dev/tenancy": "judged"} if judged else {}
    return NamespaceView(labels, active, "uid")


def test_the_namespaces_policies_name_and_the_controllers_own_are_wanted() -> None:
    wanted = named_namespaces([_policy(["a", "b"], ["ops"]), _policy(["c"]), {"metadata": {}, "spec": {}}], "own")
    assert wanted == {"own", "a", "b", "c", "ops"}


def test_a_policy_being_deleted_names_no_namespace() -> None:
    assert named_namespaces([_policy(["a"], deleting=True), _policy(["b"])], "own") == {"own", "b"}


def test_labels_follow_what_is_wanted_and_terminating_namespaces_are_left_alone() -> None:
    namespaces = {"a": _ns(False), "b": _ns(True), "stale": _ns(True), "other": _ns(False),
                  "going": _ns(True, active=False), "coming": _ns(False, active=False)}
    label, unlabel = plan_tenancy_labels(namespaces, {"a", "b", "coming", "missing"})
    assert (label, unlabel) == (["a"], ["stale"])
