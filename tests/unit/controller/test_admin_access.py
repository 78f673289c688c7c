"""The admin-access label patch: set for wanted namespaces, removed only where gpuslice set it."""

from __future__ import annotations

from gpuslice.controller.admin_access import NamespaceView, label_patch

LABEL, OWNERS = "resource.kubernetes.io/admin-access", "gpuslice.dev/admin-access-for"


def ns(labels: dict[str, str] | None = None, owners: str | None = None) -> NamespaceView:
    return NamespaceView(labels or {}, {OWNERS: owners} if owners else {}, True)


def test_wanted_namespace_gets_label_and_owner() -> None:
    assert label_patch("p", True, ns()) == {"metadata": {"labels": {LABEL: "true"}, "annotations": {OWNERS: "p"}}}
    assert label_patch("p", True, ns({LABEL: "true"}, "p")) is None
    assert label_patch("q", True, ns({LABEL: "true"}, "p")) == {
        "metadata": {"labels": {LABEL: "true"}, "annotations": {OWNERS: "p,q"}}}


def test_label_set_by_someone_else_is_neither_claimed_nor_removed() -> None:
    assert label_patch("p", True, ns({LABEL: "true"})) is None
    assert label_patch("p", False, ns({LABEL: "true"})) is None


def test_last_owner_removes_label_others_keep_it() -> None:
    assert label_patch("p", False, ns({LABEL: "true"}, "p,q")) == {"metadata": {"annotations": {OWNERS: "q"}}}
    assert label_patch("q", False, ns({LABEL: "true"}, "q")) == {
        "metadata": {"labels": {LABEL: None}, "annotations": {OWNERS: None}}}
