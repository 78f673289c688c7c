"""Read what ``gpuslice status``, ``why`` and ``plan --cluster`` look at: one LIST per kind.

Only the API server is read, so the commands work wherever kubectl does: the dev
cluster, kind, or production. What the caller may not read is said, not hidden:
a missing optional kind (DeviceTaintRules on a cluster that does not serve them, the
agents' drain record) becomes a note; a missing required one an error that names
the ClusterRole to bind.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from dataclasses import replace
from typing import Any

from gpuslice.api.ledger import ledgers as ledgers_in
from gpuslice.coordinates import (
    CLAIMS,
    DEVICE_CLASSES,
    NODES,
    PODS,
    POLICIES,
    SLICES,
    claim_templates_in,
    claims_in,
    configmaps_in,
    device_taint_rules,
    events_in,
    namespace_path,
    pod_path,
    pods_in,
    quotas_in,
)
from gpuslice.dra.names import CONTROLLER_NAMESPACE, DRAIN_LIST_LABEL, DRIVER
from gpuslice.errors import GpusliceError
from gpuslice.kube.client import Forbidden, KubeClient, KubeError, NotFound, Unauthorized
from gpuslice.planning.reads.pending import Facts
from gpuslice.planning.reads.published import drain_lists
from gpuslice.planning.reads.status_report import Snapshot

DRAIN_LABEL = f"{DRAIN_LIST_LABEL}=true"  # one drain object per draining node (agent.drain)
VIEWER = "gpuslice-viewer (manifests/viewer-rbac.yaml)"
NAMESPACES_AT_ONCE = 4  # why -A: namespaces read at a time, five lists each, so 20 requests at most


class InspectError(GpusliceError):
    """What keeps the command from answering, and what to do about it."""


def _denied(what: str, error: KubeError) -> InspectError:
    if isinstance(error, Forbidden):
        return InspectError(f"reading {what} is forbidden for this identity ({error.message}); bind the ClusterRole"
                            f" {VIEWER} to it.")
    if isinstance(error, Unauthorized):
        return InspectError(f"the API server does not accept this identity's credentials ({error.message}); check"
                            " the kubeconfig (an expired token?).")
    if isinstance(error, NotFound) and "GpuSlicePolicies" in what:
        return InspectError("the GpuSlicePolicy CRD is not installed in this cluster (kubectl apply -f crds/).")
    return InspectError(f"reading {what} failed: {error}")


async def _list(kube: KubeClient, what: str, path: str, **query: str) -> list[dict[str, Any]]:
    try:
        return await kube.list(path, **query)
    except KubeError as error:
        raise _denied(what, error) from None


async def _optional(call: Awaitable[Any], what: str, notes: list[str]) -> Any:
    try:
        return await call
    except NotFound:
        return None
    except KubeError as error:
        notes.append(f"{what} could not be read ({error.status} {error.reason}): the map leaves it out")
        return None


async def _taint_rules(kube: KubeClient, notes: list[str]) -> list[dict[str, Any]]:
    """DeviceTaintRules: served in resource.k8s.io/v1 from 1.37, v1beta2 before."""
    for version in ("v1", "v1beta2"):
        found = await _optional(kube.list(device_taint_rules(version)),
                                f"DeviceTaintRules ({version})", notes)
        if found is not None:
            return list(found)
    return []


async def read_snapshot(kube: KubeClient, home: str = CONTROLLER_NAMESPACE) -> Snapshot:
    """What the map is drawn from; ``home``: gpuslice's namespace, where the drain lists are."""
    notes: list[str] = []
    policies, slices, claims, nodes = await asyncio.gather(
        _list(kube, "GpuSlicePolicies", POLICIES),
        _list(kube, "ResourceSlices", SLICES, fieldSelector=f"spec.driver={DRIVER}"),
        _list(kube, "ResourceClaims", CLAIMS),
        _list(kube, "Nodes", NODES),
    )
    rules = await _taint_rules(kube, notes)
    drains = await _optional(kube.list(configmaps_in(home), labelSelector=DRAIN_LABEL),
                             f"the agents' drain lists (ConfigMaps gpuslice-draining-<node> in {home})", notes)
    return Snapshot(policies, slices, claims, nodes, rules, drain_lists(drains or []), tuple(notes))


async def device_classes(kube: KubeClient) -> dict[str, dict[str, Any]]:
    return {c["metadata"]["name"]: c for c in await _list(kube, "DeviceClasses", DEVICE_CLASSES)}


async def namespace_facts(kube: KubeClient, namespace: str, classes: dict[str, dict[str, Any]] | None = None,
                          home: str = CONTROLLER_NAMESPACE) -> Facts:
    """What ``namespace`` holds that bears on a pod of it waiting for a device (no pod yet); its
    reads at once. ``classes``: the DeviceClasses, when the caller has them already; ``home``:
    gpuslice's namespace, where the ledgers are."""
    claims, templates, quotas, events, namespace_body, classes, ledgers = await asyncio.gather(
        _list(kube, f"ResourceClaims in {namespace}", claims_in(namespace)),
        _list(kube, f"ResourceClaimTemplates in {namespace}", claim_templates_in(namespace)),
        _list(kube, f"ResourceQuotas in {namespace}", quotas_in(namespace)),
        _list(kube, f"Events in {namespace}", events_in(namespace)),
        _optional(kube.get(namespace_path(namespace)), f"namespace {namespace}", []),
        device_classes(kube) if classes is None else _ready(classes),
        _optional(kube.list(ledgers_in(home), labelSelector=f"gpuslice.dev/tenant={namespace}"),
                  f"the maxMemory ledgers (in {home})", []))
    return Facts(namespace, None, None, {c["metadata"]["name"]: c for c in claims},
                 {t["metadata"]["name"]: t for t in templates}, quotas,
                 str(((namespace_body or {}).get("metadata") or {}).get("uid", "")), events, classes,
                 {str((b.get("spec") or {}).get("policy")): b for b in ledgers or []})


async def _ready(value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return value


async def namespaces_facts(kube: KubeClient, namespaces: Iterable[str], classes: dict[str, dict[str, Any]],
                           at_once: int = NAMESPACES_AT_ONCE, home: str = CONTROLLER_NAMESPACE) -> dict[str, Facts]:
    """``namespace_facts`` of each, ``at_once`` namespaces at a time (five reads each)."""
    gate = asyncio.Semaphore(at_once)

    async def one(namespace: str) -> Facts:
        async with gate:
            return await namespace_facts(kube, namespace, classes, home)

    names = sorted(set(namespaces))
    return dict(zip(names, await asyncio.gather(*(one(n) for n in names)), strict=True))


async def read_facts(kube: KubeClient, namespace: str, name: str, home: str = CONTROLLER_NAMESPACE) -> Facts:
    """The pod ``namespace/name`` (or, when there is none, the ResourceClaim of that name) and what
    the namespace holds that bears on it."""
    pod = await _optional(kube.get(pod_path(namespace, name)), f"pod {namespace}/{name}", [])
    facts = await namespace_facts(kube, namespace, home=home)
    return replace(facts, pod=pod, claim_name=None if pod is not None else name)


async def pending_pods(kube: KubeClient, namespace: str | None) -> list[dict[str, Any]]:
    """The Pending pods of ``namespace`` (None: of every namespace), oldest first."""
    path = pods_in(namespace) if namespace else PODS
    pods = await _list(kube, f"pods in {namespace}" if namespace else "pods", path,
                       fieldSelector="status.phase=Pending")
    return sorted(pods, key=lambda p: (str(p["metadata"].get("creationTimestamp", "")),
                                       str(p["metadata"]["namespace"]), str(p["metadata"]["name"])))
