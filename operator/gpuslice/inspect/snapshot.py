"""Read what ``gpuslice status``, ``why`` and ``plan --cluster`` look at: one LIST per kind.

Only the API server is read, so the commands work wherever kubectl does: the dev
cluster, kind, or production. What the caller may not read is said, not hidden:
a missing optional kind (DeviceTaintRules on a cluster that does not serve them, the
agents' drain record) becomes a note; a missing required one an error that names
the ClusterRole to bind.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

from gpuslice.api.ledger import LEDGERS
from gpuslice.dra.names import CONTROLLER_NAMESPACE, DRIVER
from gpuslice.kube.client import KubeClient, KubeError
from gpuslice.planning.pending import Facts
from gpuslice.planning.status_report import Snapshot

POLICIES = "/apis/gpuslice.dev/v1alpha1/gpuslicepolicies"
RESOURCE = "/apis/resource.k8s.io/v1"
DRAINING = f"/api/v1/namespaces/{CONTROLLER_NAMESPACE}/configmaps/gpuslice-draining"
VIEWER = "gpuslice-viewer (manifests/viewer-rbac.yaml)"


class InspectError(Exception):
    """What keeps the command from answering, and what to do about it."""


def _denied(what: str, error: KubeError) -> InspectError:
    if error.status == 403:
        return InspectError(f"reading {what} is forbidden for this identity ({error.message}); bind the ClusterRole"
                            f" {VIEWER} to it.")
    if error.status == 401:
        return InspectError(f"the API server does not accept this identity's credentials ({error.message}); check"
                            " the kubeconfig (an expired token?).")
    if error.status == 404 and "GpuSlicePolicies" in what:
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
    except KubeError as error:
        if error.status == 404:
            return None
        notes.append(f"{what} could not be read ({error.status} {error.reason}): the map leaves it out")
        return None


async def _taint_rules(kube: KubeClient, notes: list[str]) -> list[dict[str, Any]]:
    """DeviceTaintRules: served in resource.k8s.io/v1 from 1.37, v1beta2 before."""
    for version in ("v1", "v1beta2"):
        found = await _optional(kube.list(f"/apis/resource.k8s.io/{version}/devicetaintrules"),
                                f"DeviceTaintRules ({version})", notes)
        if found is not None:
            return list(found)
    return []


async def read_snapshot(kube: KubeClient) -> Snapshot:
    notes: list[str] = []
    policies, slices, claims, nodes = await asyncio.gather(
        _list(kube, "GpuSlicePolicies", POLICIES),
        _list(kube, "ResourceSlices", f"{RESOURCE}/resourceslices", fieldSelector=f"spec.driver={DRIVER}"),
        _list(kube, "ResourceClaims", f"{RESOURCE}/resourceclaims"),
        _list(kube, "Nodes", "/api/v1/nodes"),
    )
    rules = await _taint_rules(kube, notes)
    draining = await _optional(kube.get(DRAINING), "the agents' drain record (ConfigMap gpuslice-draining)", notes)
    listed = {node: str(names).split() for node, names in ((draining or {}).get("data") or {}).items()}
    return Snapshot(policies, slices, claims, nodes, rules, listed, tuple(notes))


async def read_facts(kube: KubeClient, namespace: str, name: str) -> Facts:
    """The pod ``namespace/name`` (or, when there is none, the ResourceClaim of that name) and what
    the namespace holds that bears on it."""
    ns = f"/api/v1/namespaces/{namespace}"
    pod = await _optional(kube.get(f"{ns}/pods/{name}"), f"pod {namespace}/{name}", [])
    claims = {c["metadata"]["name"]: c for c in await _list(
        kube, f"ResourceClaims in {namespace}", f"{RESOURCE}/namespaces/{namespace}/resourceclaims")}
    templates = {t["metadata"]["name"]: t for t in await _list(
        kube, f"ResourceClaimTemplates in {namespace}", f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates")}
    quotas = await _list(kube, f"ResourceQuotas in {namespace}", f"{ns}/resourcequotas")
    events = await _list(kube, f"Events in {namespace}", f"{ns}/events")
    namespace_body = await _optional(kube.get(ns), f"namespace {namespace}", [])
    classes = {c["metadata"]["name"]: c for c in await _list(kube, "DeviceClasses", f"{RESOURCE}/deviceclasses")}
    ledgers = await _optional(kube.list(LEDGERS, labelSelector=f"gpuslice.dev/tenant={namespace}"),
                              "the maxMemory ledgers", [])
    return Facts(namespace, pod, None if pod is not None else name, claims, templates, quotas,
                 str(((namespace_body or {}).get("metadata") or {}).get("uid", "")), events, classes,
                 {str((b.get("spec") or {}).get("policy")): b for b in ledgers or []})
