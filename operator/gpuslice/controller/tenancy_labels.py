"""The namespace label ``gpuslice.dev/tenancy=judged``: on every namespace some GpuSlicePolicy
names (in ``spec.tenants`` or ``spec.adminAccess.namespaces``) and on the controller's own, and on
no other.

The label only routes admission (planning.cluster.tenancy_rule): in a labelled namespace the tenancy rule
judges claims of gpuslice's DeviceClasses against every policy; everywhere else a rule without
parameters refuses them, so the rule that needs the GpuSlicePolicy CRD can never refuse anything
in a namespace gpuslice has no business in. Both refuse a non-tenant, so whoever sets or removes
the label by hand decides only which rule answers: it can stop no tenancy check, only keep that
namespace's own gpuslice claims out. That is why, unlike the admin-access label, it needs no record
of who set it: the controller owns it on every namespace, and puts it where it is wanted.

The label ``gpuslice.dev/memory-limit=judged`` is kept the same way on every namespace that is
a maxMemory tenant of some policy (and the controller's own, for its probe of the webhook): it
routes their claims to the maxMemory webhook (planning.cluster.memory_rule), and the tenancy rule refuses
a maxMemory tenant's claims in a namespace without it, so neither label can be used to skip a check.

A policy being deleted names no namespace any more: its deletion handler takes the label off the
namespaces only it named, before its finalizer goes, so deleting the CRD (which deletes every
policy first while the controller runs) leaves no labelled namespace behind; and a controller that
finds no CRD takes the labels off itself (controller.crd).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Set
from typing import Any

import structlog

from gpuslice.controller.admin_access import NamespaceView
from gpuslice.coordinates import namespace_path
from gpuslice.dra.names import MEMORY_JUDGED, MEMORY_LABEL, TENANCY_JUDGED, TENANCY_LABEL
from gpuslice.dra.policy_wire import admin_namespaces, tenant_namespaces, tenants
from gpuslice.kube.client import KubeClient, NotFound

log = structlog.get_logger(__name__)
Label = tuple[str, str]  # key, value
TENANCY_ROUTE: Label = (TENANCY_LABEL, TENANCY_JUDGED)
MEMORY_ROUTE: Label = (MEMORY_LABEL, MEMORY_JUDGED)


def named_namespaces(policies: Iterable[Mapping[str, Any]], own: str) -> set[str]:
    """The namespaces to label: those the policies (raw bodies, valid or not) name, and ``own``.
    A policy being deleted names none: its deletion handler unlabels what only it named."""
    wanted = {own}
    for body in policies:
        if (body.get("metadata") or {}).get("deletionTimestamp"):
            continue
        wanted |= {*tenant_namespaces(body), *admin_namespaces(body)}
    return wanted


def memory_namespaces(policies: Iterable[Mapping[str, Any]], own: str) -> set[str]:
    """The namespaces to route to the maxMemory webhook: a tenant with maxMemory in some policy (raw
    bodies, valid or not: the tenancy rule asks for the label as soon as the spec says maxMemory),
    and ``own``."""
    wanted = {own}
    for body in policies:
        if (body.get("metadata") or {}).get("deletionTimestamp"):
            continue
        wanted |= {t.namespace for t in tenants(body) if t.max_memory is not None}
    return wanted


def judged(view: NamespaceView, route: Label = TENANCY_ROUTE) -> bool:
    return view.labels.get(route[0]) == route[1]


# What the controller last wrote of a routing label: (namespace, label key) -> (value, or None when it
# took the label off; the namespace's resourceVersion the API server answered with).
Written = dict[tuple[str, str], tuple[str | None, int]]


def plan_tenancy_labels(namespaces: Mapping[str, NamespaceView], wanted: Set[str],
                        route: Label = TENANCY_ROUTE, written: Written | None = None) -> tuple[list[str], list[str]]:
    """(namespaces to label, namespaces to unlabel). A terminating namespace is left as it is. A
    namespace the watch shows older than the controller's own write of the label is taken as that
    write left it: every converge of a fleet's policies, each with the namespaces as its handler
    first saw them, labelled every tenant namespace again (200 writes for 20 namespaces)."""
    def has(name: str, view: NamespaceView) -> bool:
        mine = (written or {}).get((name, route[0]))
        if mine is not None and (view.version is None or view.version < mine[1]):
            return mine[0] == route[1]
        return judged(view, route)

    label = sorted(n for n in wanted if (v := namespaces.get(n)) is not None and v.active and not has(n, v))
    unlabel = sorted(n for n, v in namespaces.items() if n not in wanted and v.active and has(n, v))
    return label, unlabel


async def sync_tenancy_labels(kube: KubeClient, lock: asyncio.Lock, namespaces: Mapping[str, NamespaceView],
                              wanted: Set[str] | Callable[[], Set[str]], route: Label = TENANCY_ROUTE,
                              written: Written | None = None) -> None:
    """Label ``wanted`` namespaces and unlabel the others; a namespace gone meanwhile is no error.
    ``lock``: one sync at a time (two from different handlers could undo each other's work);
    ``wanted``, when a callable, is asked once the lock is held: a handler's own copy of the policies
    lacks those created while it waited, and unlabelled their tenants as each converged (a burst of
    new policies: tenants' claims refused meanwhile, each namespace written up to 11 times);
    ``written``: the controller's record of its own writes, kept up to date here."""
    key, value = route
    async with lock:
        label, unlabel = plan_tenancy_labels(namespaces, wanted() if callable(wanted) else wanted, route, written)
        for name, set_to in [*((n, value) for n in label), *((n, None) for n in unlabel)]:
            try:
                answer = await kube.merge_patch(namespace_path(name),
                                                {"metadata": {"labels": {key: set_to}}})
            except NotFound:
                continue
            version = ((answer or {}).get("metadata") or {}).get("resourceVersion")
            if written is not None and str(version).isdigit():
                written[(name, key)] = (set_to, int(str(version)))
        if label or unlabel:
            log.info("routing labels synced", label=f"{key}={value}", labelled=label, unlabelled=unlabel)


async def sync_routes(kube: KubeClient, lock: asyncio.Lock, namespaces: Mapping[str, NamespaceView],
                      policies: Callable[[], Iterable[Mapping[str, Any]]], own: str,
                      written: Written | None = None) -> None:
    """Both routing labels, as the policies say them: ``policies`` gives the raw bodies the watch
    holds when each label is judged (under the lock), not when the caller began."""
    await sync_tenancy_labels(kube, lock, namespaces, lambda: named_namespaces(policies(), own), written=written)
    await sync_tenancy_labels(kube, lock, namespaces, lambda: memory_namespaces(policies(), own), MEMORY_ROUTE,
                              written)


def routed_as_wanted(name: str, view: NamespaceView, policies: Iterable[Mapping[str, Any]], own: str) -> bool:
    """Whether a namespace carries exactly the routing labels ``policies`` want on it."""
    bodies = list(policies)
    return (judged(view) == (name in named_namespaces(bodies, own))
            and judged(view, MEMORY_ROUTE) == (name in memory_namespaces(bodies, own)))
