"""The namespace label ``gpuslice.dev/tenancy=judged``: on every namespace some GpuSlicePolicy
names (in ``spec.tenants`` or ``spec.adminAccess.namespaces``) and on the controller's own, and on
no other.

The label only routes admission (planning.tenancy_rule): in a labelled namespace the tenancy rule
judges claims of gpuslice's DeviceClasses against every policy; everywhere else a rule without
parameters refuses them, so the rule that needs the GpuSlicePolicy CRD can never refuse anything
in a namespace gpuslice has no business in. Both refuse a non-tenant, so whoever sets or removes
the label by hand decides only which rule answers: it can stop no tenancy check, only keep that
namespace's own gpuslice claims out. That is why, unlike the admin-access label, it needs no record
of who set it: the controller owns it on every namespace, and puts it where it is wanted.

A policy being deleted names no namespace any more: its deletion handler takes the label off the
namespaces only it named, before its finalizer goes, so deleting the CRD (which deletes every
policy first while the controller runs) leaves no labelled namespace behind; and a controller that
finds no CRD takes the labels off itself (controller.crd).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Set
from typing import Any

import structlog

from gpuslice.controller.admin_access import NamespaceView
from gpuslice.dra.names import TENANCY_JUDGED, TENANCY_LABEL
from gpuslice.kube.client import KubeClient, NotFound

log = structlog.get_logger(__name__)


def named_namespaces(policies: Iterable[Mapping[str, Any]], own: str) -> set[str]:
    """The namespaces to label: those the policies (raw bodies, valid or not) name, and ``own``.
    A policy being deleted names none: its deletion handler unlabels what only it named."""
    wanted = {own}
    for body in policies:
        if (body.get("metadata") or {}).get("deletionTimestamp"):
            continue
        spec = body.get("spec") or {}
        wanted |= {str(t.get("namespace")) for t in spec.get("tenants") or [] if t.get("namespace")}
        wanted |= {str(n) for n in (spec.get("adminAccess") or {}).get("namespaces") or []}
    return wanted


def judged(view: NamespaceView) -> bool:
    return view.labels.get(TENANCY_LABEL) == TENANCY_JUDGED


def plan_tenancy_labels(namespaces: Mapping[str, NamespaceView], wanted: Set[str]) -> tuple[list[str], list[str]]:
    """(namespaces to label, namespaces to unlabel). A terminating namespace is left as it is."""
    label = sorted(n for n in wanted if (v := namespaces.get(n)) is not None and v.active and not judged(v))
    unlabel = sorted(n for n, v in namespaces.items() if n not in wanted and v.active and judged(v))
    return label, unlabel


async def sync_tenancy_labels(kube: KubeClient, lock: asyncio.Lock, namespaces: Mapping[str, NamespaceView],
                              wanted: Set[str]) -> None:
    """Label ``wanted`` namespaces and unlabel the others; a namespace gone meanwhile is no error.
    ``lock``: one sync at a time (two from different handlers could undo each other's work)."""
    async with lock:
        label, unlabel = plan_tenancy_labels(namespaces, wanted)
        for name, value in [*((n, TENANCY_JUDGED) for n in label), *((n, None) for n in unlabel)]:
            try:
                await kube.merge_patch(f"/api/v1/namespaces/{name}", {"metadata": {"labels": {TENANCY_LABEL: value}}})
            except NotFound:
                continue
        if label or unlabel:
            log.info("tenancy labels synced", label=f"{TENANCY_LABEL}={TENANCY_JUDGED}", labelled=label,
                     unlabelled=unlabel)
