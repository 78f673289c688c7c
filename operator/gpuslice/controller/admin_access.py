"""The admin-access namespace label: set for the namespaces policies name, and
removed only where gpuslice set it.

Which policies asked for the label is recorded in an annotation on the
namespace; the label is gpuslice's only while that annotation exists, so a
label someone else set is never taken away.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import structlog

from gpuslice.dra.names import ADMIN_ACCESS_LABEL, ADMIN_ACCESS_OWNERS
from gpuslice.kube.client import KubeClient

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class NamespaceView:
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    active: bool  # False while terminating

    @property
    def owners(self) -> set[str]:
        return {p for p in self.annotations.get(ADMIN_ACCESS_OWNERS, "").split(",") if p}


def label_patch(policy: str, wanted: bool, namespace: NamespaceView) -> dict[str, object] | None:
    """The merge patch that brings one namespace in line for one policy, or None."""
    owners, label = namespace.owners, namespace.labels.get(ADMIN_ACCESS_LABEL)
    if wanted:
        if label == "true" and (policy in owners or not owners):
            return None  # ours already, or set by someone else (then not ours to record)
        new = sorted(owners | {policy})
        return {"metadata": {"labels": {ADMIN_ACCESS_LABEL: "true"},
                             "annotations": {ADMIN_ACCESS_OWNERS: ",".join(new)}}}
    if policy not in owners:
        return None
    rest = sorted(owners - {policy})
    if rest:
        return {"metadata": {"annotations": {ADMIN_ACCESS_OWNERS: ",".join(rest)}}}
    return {"metadata": {"labels": {ADMIN_ACCESS_LABEL: None}, "annotations": {ADMIN_ACCESS_OWNERS: None}}}


async def sync_admin_labels(
    kube: KubeClient, policy: str, wanted: set[str], namespaces: Mapping[str, NamespaceView]
) -> list[str]:
    """Patch the namespaces that need it; returns the names patched."""
    patched = []
    for name, view in sorted(namespaces.items()):
        if not view.active:
            continue
        patch = label_patch(policy, name in wanted, view)
        if patch is not None:
            await kube.merge_patch(f"/api/v1/namespaces/{name}", patch)
            patched.append(name)
    if patched:
        log.info("admin-access labels synced", policy=policy, namespaces=patched)
    return patched
