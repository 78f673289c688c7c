"""The admin-access namespace label: set for the namespaces policies name, and
removed only where gpuslice set it.

Which namespaces gpuslice labelled is recorded in each policy's status
(``status.adminAccessLabels``), which only the controller writes: anything kept on
the namespace itself (an annotation) could be deleted by whoever edits the
namespace, and the label would then outlive its grant. The record is written
before the label is set and dropped only after the label is removed, so a
controller killed in between finds the label either recorded or absent.
A label someone else set before gpuslice (no policy recorded it) is left alone.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Set
from dataclasses import dataclass, field
from typing import Any

import structlog

from gpuslice.coordinates import namespace_path
from gpuslice.dra.names import ADMIN_ACCESS_LABEL
from gpuslice.kube.client import KubeClient

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class NamespaceView:
    labels: Mapping[str, str]
    active: bool  # False while terminating
    uid: str = ""
    # Its resourceVersion as a number, when it is one: whether it is older than a write of the
    # controller's own (controller.tenancy_labels). Not what a namespace is: never compared.
    version: int | None = field(default=None, compare=False)

    @classmethod
    def from_namespace(cls, labels: Mapping[str, str], uid: str | None, status: Mapping[str, Any],
                       resource_version: str | None = None) -> NamespaceView:
        return cls(dict(labels), status.get("phase") != "Terminating", uid or "", _number(resource_version))

    @property
    def labelled(self) -> bool:
        return self.labels.get(ADMIN_ACCESS_LABEL) == "true"


def _number(text: str | None) -> int | None:
    try:
        return int(str(text))
    except ValueError:
        return None


@dataclass(frozen=True)
class LabelPlan:
    """What one policy does about the label: record first, label, unlabel, then forget."""

    record: frozenset[str]  # the policy's record once labels are set (written before labelling)
    label: frozenset[str]
    unlabel: frozenset[str]
    final: frozenset[str]  # the record once labels are removed

    @property
    def changes(self) -> bool:
        return bool(self.label or self.unlabel)


def plan_labels(wanted: Set[str], namespaces: Mapping[str, NamespaceView], mine: Set[str],
                others: Set[str]) -> LabelPlan:
    """``mine``: namespaces this policy recorded; ``others``: those other policies recorded."""
    record, label, unlabel = set(mine), set(), set()
    for name in sorted(wanted):
        view = namespaces.get(name)
        if view is None or not view.active:
            continue
        if view.labelled and name not in mine and name not in others:
            continue  # set by someone else: not ours to record, nor ever to remove
        record.add(name)
        if not view.labelled:
            label.add(name)
    final = set(record)
    for name in sorted(mine - set(wanted)):
        view = namespaces.get(name)
        if view is not None and view.active and view.labelled and name not in others:
            unlabel.add(name)
        final.discard(name)
    return LabelPlan(frozenset(record), frozenset(label), frozenset(unlabel), frozenset(final))


async def sync_admin_labels(
    kube: KubeClient, policy: str, plan: LabelPlan, mine: Set[str],
    write_record: Callable[[list[str]], Awaitable[None]],
) -> None:
    """Carry out ``plan``: the record before the labels it covers, the labels removed before the
    record forgets them."""
    if plan.record != mine:
        await write_record(sorted(plan.record))
    for name in sorted(plan.label):
        await kube.merge_patch(namespace_path(name), {"metadata": {"labels": {ADMIN_ACCESS_LABEL: "true"}}})
    for name in sorted(plan.unlabel):
        await kube.merge_patch(namespace_path(name), {"metadata": {"labels": {ADMIN_ACCESS_LABEL: None}}})
    if plan.final != plan.record:
        await write_record(sorted(plan.final))
    if plan.changes:
        log.info("admin-access labels synced", policy=policy, labelled=sorted(plan.label),
                 unlabelled=sorted(plan.unlabel))
