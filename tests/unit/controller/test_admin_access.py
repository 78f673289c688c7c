"""The admin-access label plan: set for wanted namespaces, removed only where a policy recorded it."""

from __future__ import annotations

from gpuslice.controller.admin_access import LabelPlan, NamespaceView, plan_labels

LABEL = "resource.kubernetes.io/admin-access"


def ns(labelled: bool = False, active: bool = True) -> NamespaceView:
    return NamespaceView({LABEL: "true"} if labelled else {}, active, "uid")


def plan(wanted: set[str], namespaces: dict[str, NamespaceView], mine: set[str] = frozenset(),  # type: ignore[assignment]
         others: set[str] = frozenset()) -> LabelPlan:  # type: ignore[assignment]
    return plan_labels(wanted, namespaces, mine, others)


def test_wanted_namespace_is_recorded_before_it_is_labelled() -> None:
    found = plan({"ops"}, {"ops": ns()})
    assert (found.record, found.label, found.unlabel, found.final) == ({"ops"}, {"ops"}, set(), {"ops"})
    assert not plan({"ops"}, {"ops": ns(True)}, mine={"ops"}).changes


def test_label_set_by_someone_else_is_neither_recorded_nor_removed() -> None:
    found = plan({"ops"}, {"ops": ns(True)})
    assert (found.record, found.label) == (set(), set())
    assert not plan(set(), {"ops": ns(True)}).unlabel


def test_a_label_another_policy_recorded_is_shared_and_kept() -> None:
    assert plan({"ops"}, {"ops": ns(True)}, others={"ops"}).record == {"ops"}
    found = plan(set(), {"ops": ns(True)}, mine={"ops"}, others={"ops"})
    assert (found.unlabel, found.final) == (set(), set())


def test_the_last_policy_that_recorded_it_removes_the_label_then_forgets() -> None:
    found = plan(set(), {"ops": ns(True)}, mine={"ops"})
    assert (found.record, found.unlabel, found.final) == ({"ops"}, {"ops"}, set())


def test_terminating_or_missing_namespaces_are_forgotten_untouched() -> None:
    found = plan({"gone"}, {"ending": ns(True, active=False)}, mine={"ending"})
    assert (found.label, found.unlabel, found.final) == (set(), set(), set())
