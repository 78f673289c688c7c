"""A policy's cluster-level objects: everything a tenant needs besides the devices.

Pure: policy + the namespaces that exist + the devices published for it in,
manifests out. Names are deterministic, so a controller that restarts half way
converges on the same objects instead of making duplicates. Every object
carries the policy's labels (to find and prune them) and an owner reference
(so garbage collection removes them with the policy).
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass, field
from typing import Any

from gpuslice.api.ledger import LEDGER_KIND, ledger_name
from gpuslice.api.policy import GROUP, KIND, VERSION, Tenant
from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.dra.names import LABEL_POLICY, MANAGED_BY, quota_resource
from gpuslice.jsontypes import Object
from gpuslice.planning.aligned import ALIGNED_LABEL, AlignedTemplate, aligned_claim_spec, aligned_templates
from gpuslice.planning.kinds import SHARED, DeviceKind, quota, template_names
from gpuslice.planning.modes import device_kinds
from gpuslice.planning.selection import Selection

RESOURCE_V1 = "resource.k8s.io/v1"


@dataclass(frozen=True)
class DeviceRef:
    """One published device: where the scheduler finds it."""

    pool: str
    device: str


@dataclass
class DesiredObjects:
    """A policy's objects in the order they are put in place: the classes and the quotas first
    (a tenant is admitted only once its quota exists), then the templates. No DeviceTaintRules:
    a policy's taints travel on the devices the node agents publish (``planning.node.node_pool``)."""

    classes: list[Object] = field(default_factory=list)
    quotas: list[Object] = field(default_factory=list)
    templates: list[Object] = field(default_factory=list)

    def limits(self) -> list[Object]:
        return [*self.classes, *self.quotas]

    def rest(self) -> list[Object]:
        return list(self.templates)

    def all(self) -> list[Object]:
        return [*self.limits(), *self.rest()]


def policy_labels(policy: str) -> dict[str, str]:
    return {**MANAGED_BY, LABEL_POLICY: policy}


def owner_reference(policy: GpuSlicePolicy) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": policy.name,
        "uid": policy.metadata.uid, "controller": True, "blockOwnerDeletion": True,
    }


def _meta(policy: GpuSlicePolicy, name: str, namespace: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name, "labels": policy_labels(policy.name), "ownerReferences": [owner_reference(policy)],
    }
    if namespace:
        meta["namespace"] = namespace
    return meta


def device_class(policy: GpuSlicePolicy, kind: DeviceKind, extended: bool = False) -> Object:
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": kind.selector}}]}
    if extended and policy.spec.extended_resource_name:
        spec["extendedResourceName"] = policy.spec.extended_resource_name
    return {"apiVersion": RESOURCE_V1, "kind": "DeviceClass",
            "metadata": _meta(policy, kind.class_name), "spec": spec}


def claim_template(policy: GpuSlicePolicy, namespace: str, name: str, kind: DeviceKind) -> Object:
    """Exactly one device of ``kind``; in shared mode, exactly one sliceSize of it."""
    request: dict[str, Any] = {"deviceClassName": kind.class_name}
    if kind.kind == SHARED and policy.spec.slicing.slice_size:
        request["capacity"] = {"requests": {"memory": policy.spec.slicing.slice_size}}
    return {
        "apiVersion": RESOURCE_V1, "kind": "ResourceClaimTemplate",
        "metadata": _meta(policy, name, namespace),
        "spec": {
            "metadata": {"labels": {LABEL_POLICY: policy.name}},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}},
        },
    }


def aligned_claim_template(policy: GpuSlicePolicy, namespace: str, template: AlignedTemplate) -> Object:
    """``count`` whole GPUs that sit together (spec.topology; planning.aligned)."""
    return {
        "apiVersion": RESOURCE_V1, "kind": "ResourceClaimTemplate",
        "metadata": _meta(policy, template.name, namespace),
        "spec": {
            "metadata": {"labels": {LABEL_POLICY: policy.name, ALIGNED_LABEL: str(template.count)}},
            "spec": aligned_claim_spec(template),
        },
    }


def quota_name(policy: str) -> str:
    return f"gpuslice-{policy}"


def resource_quota(policy: GpuSlicePolicy, tenant: Tenant, kinds: list[DeviceKind]) -> Object:
    """One quota per limited tenant with a key per kind: a kind the tenant is not granted is 0."""
    hard = {quota_resource(k.class_name): str(quota(tenant, k)) for k in kinds}
    return {
        "apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": _meta(policy, quota_name(policy.name), tenant.namespace),
        "spec": {"hard": hard},
    }


def desired_objects(policy: GpuSlicePolicy, namespaces: Set[str]) -> DesiredObjects:
    """What should exist for ``policy``, given the namespaces that exist now.

    No DeviceTaintRules: in ``resource.k8s.io/v1`` a rule selects one device by driver, pool and
    name, so rules would cost one object per taint and device (72,000 for one tainted policy on
    1,000 nodes of 8 GPUs in 9 devices each), each written, watched by the scheduler and the
    eviction controller, and rewritten whenever a pool changes. The node agents put a policy's
    taints on the devices they publish instead.
    """
    desired = DesiredObjects()
    kinds = device_kinds(policy, Selection(()))
    desired.classes = [device_class(policy, k, extended=i == 0) for i, k in enumerate(kinds)]
    for tenant in policy.spec.tenants:
        if tenant.namespace not in namespaces:
            continue
        if tenant.count_limited:
            desired.quotas.append(resource_quota(policy, tenant, kinds))
        for name, kind in template_names(policy, tenant, kinds).items():
            desired.templates.append(claim_template(policy, tenant.namespace, name, kind))
        for aligned in aligned_templates(policy, tenant, kinds):
            desired.templates.append(aligned_claim_template(policy, tenant.namespace, aligned))
    return desired


LABEL_TENANT = "gpuslice.dev/tenant"


def ledger(policy: GpuSlicePolicy, tenant: Tenant, namespace_uid: str, home: str) -> Object:
    """The maxMemory ledger of one tenant, in the controller's namespace: its spec is the limit in
    force (the webhook writes its status, the charges)."""
    assert tenant.max_memory is not None
    assert tenant.max_memory_bytes is not None
    meta = _meta(policy, ledger_name(policy.name, tenant.namespace), home)
    meta["labels"][LABEL_TENANT] = tenant.namespace
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": LEDGER_KIND, "metadata": meta,
        "spec": {"policy": policy.name, "namespace": tenant.namespace, "namespaceUid": namespace_uid,
                 "maxMemory": tenant.max_memory, "limitBytes": tenant.max_memory_bytes},
    }


def desired_ledgers(policy: GpuSlicePolicy, namespaces: Mapping[str, str], home: str) -> list[Object]:
    """A ledger per maxMemory tenant whose namespace exists (``namespaces``: name -> UID), in ``home``
    (gpuslice's own namespace)."""
    return [ledger(policy, t, namespaces[t.namespace], home) for t in policy.spec.tenants
            if t.memory_limited and namespaces.get(t.namespace)]
