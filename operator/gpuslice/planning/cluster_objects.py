"""A policy's cluster-level objects: everything a tenant needs besides the devices.

Pure: policy + the namespaces that exist + the devices published for it in,
manifests out. Names are deterministic, so a controller that restarts half way
converges on the same objects instead of making duplicates. Every object
carries the policy's labels (to find and prune them) and an owner reference
(so garbage collection removes them with the policy).
"""

from __future__ import annotations

from collections.abc import Iterable, Set
from dataclasses import dataclass, field
from typing import Any

from gpuslice.api.policy import GROUP, KIND, VERSION
from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.dra.names import (
    ATTR_POLICY,
    ATTRIBUTE_DOMAIN,
    DRIVER,
    LABEL_POLICY,
    MANAGED_BY,
    device_class_name,
    quota_resource,
)

Manifest = dict[str, Any]
RESOURCE_V1 = "resource.k8s.io/v1"
ADMISSION_V1 = "admissionregistration.k8s.io/v1"


@dataclass(frozen=True)
class DeviceRef:
    """One published device: where the scheduler finds it."""

    pool: str
    device: str


@dataclass
class DesiredObjects:
    cluster: list[Manifest] = field(default_factory=list)
    namespaced: list[Manifest] = field(default_factory=list)

    def all(self) -> list[Manifest]:
        return [*self.cluster, *self.namespaced]


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


def device_class(policy: GpuSlicePolicy) -> Manifest:
    selector = (
        f'device.driver == "{DRIVER}" &&'
        f' device.attributes["{ATTRIBUTE_DOMAIN}"].?{ATTR_POLICY}.orValue("") == "{policy.name}"'
    )
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": selector}}]}
    if policy.spec.extended_resource_name:
        spec["extendedResourceName"] = policy.spec.extended_resource_name
    return {"apiVersion": RESOURCE_V1, "kind": "DeviceClass",
            "metadata": _meta(policy, device_class_name(policy.name)), "spec": spec}


def claim_template(policy: GpuSlicePolicy, namespace: str) -> Manifest:
    request: dict[str, Any] = {"deviceClassName": device_class_name(policy.name)}
    if policy.spec.slicing.mode == "shared" and policy.spec.slicing.slice_size:
        request["capacity"] = {"requests": {"memory": policy.spec.slicing.slice_size}}
    return {
        "apiVersion": RESOURCE_V1, "kind": "ResourceClaimTemplate",
        "metadata": _meta(policy, policy.spec.claim_template_name, namespace),
        "spec": {
            "metadata": {"labels": {LABEL_POLICY: policy.name}},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}},
        },
    }


def quota_name(policy: str) -> str:
    return f"gpuslice-{policy}"


def resource_quota(policy: GpuSlicePolicy, namespace: str, max_slices: int) -> Manifest:
    return {
        "apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": _meta(policy, quota_name(policy.name), namespace),
        "spec": {"hard": {quota_resource(device_class_name(policy.name)): str(max_slices)}},
    }


def _cel_list(values: Iterable[str]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in sorted(values)) + "]"


def tenancy_policy_name(policy: str) -> str:
    return f"gpuslice-tenancy-{policy}"


def tenancy_admission(policy: GpuSlicePolicy) -> list[Manifest]:
    """Only tenants (and admin namespaces) may claim the policy's class; only admin
    namespaces may ask for adminAccess on it. Denials name the policy and the fix."""
    klass = device_class_name(policy.name)
    tenants = {t.namespace for t in policy.spec.tenants}
    admins = set(policy.spec.admin_access.namespaces)
    name = tenancy_policy_name(policy.name)
    requests = (
        "request.resource.resource == 'resourceclaims'"
        " ? (has(object.spec.devices) && has(object.spec.devices.requests) ? object.spec.devices.requests : [])"
        " : (has(object.spec.spec.devices) && has(object.spec.spec.devices.requests)"
        " ? object.spec.spec.devices.requests : [])"
    )
    uses = (
        f"variables.requests.exists(r, (has(r.exactly) && r.exactly.deviceClassName == '{klass}')"
        f" || (has(r.firstAvailable) && r.firstAvailable.exists(s, s.deviceClassName == '{klass}')))"
    )
    admin = (
        f"variables.requests.exists(r, has(r.exactly) && r.exactly.deviceClassName == '{klass}'"
        " && has(r.exactly.adminAccess) && r.exactly.adminAccess)"
    )
    who = "(request.resource.resource == 'resourceclaims' ? 'ResourceClaim ' : 'ResourceClaimTemplate ')"
    vap = {
        "apiVersion": ADMISSION_V1, "kind": "ValidatingAdmissionPolicy",
        "metadata": _meta(policy, name),
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "matchPolicy": "Equivalent",
                "resourceRules": [{
                    "apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"],
                    "operations": ["CREATE", "UPDATE"],
                    "resources": ["resourceclaims", "resourceclaimtemplates"],
                }],
            },
            "variables": [
                {"name": "requests", "expression": requests},
                {"name": "usesClass", "expression": uses},
                {"name": "wantsAdminAccess", "expression": admin},
            ],
            "validations": [
                {
                    "expression": f"!variables.usesClass || request.namespace in {_cel_list(tenants | admins)}",
                    "messageExpression": (
                        f"{who} + object.metadata.name + ': namespace ' + request.namespace + ' is not a"
                        f" tenant of GpuSlicePolicy {policy.name}, so it may not use DeviceClass {klass};"
                        f" ask the platform team to add it to spec.tenants of GpuSlicePolicy {policy.name}'"
                    ),
                    "reason": "Forbidden",
                },
                {
                    "expression": f"!variables.wantsAdminAccess || request.namespace in {_cel_list(admins)}",
                    "messageExpression": (
                        f"{who} + object.metadata.name + ': namespace ' + request.namespace + ' may not"
                        f" request adminAccess to devices of GpuSlicePolicy {policy.name}; only"
                        f" spec.adminAccess.namespaces of that policy may'"
                    ),
                    "reason": "Forbidden",
                },
            ],
        },
    }
    binding = {
        "apiVersion": ADMISSION_V1, "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": _meta(policy, name),
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }
    return [vap, binding]


def desired_objects(policy: GpuSlicePolicy, namespaces: Set[str]) -> DesiredObjects:
    """What should exist for ``policy``, given the namespaces that exist now.

    No DeviceTaintRules: a policy's ``spec.taints`` travel on the devices the node agents
    publish (``planning.node_pool``). In ``resource.k8s.io/v1`` a rule selects one device by
    driver, pool and name, so rules would cost one object per taint and device (72,000 for
    one tainted policy on 1,000 nodes of 8 GPUs in 9 devices each), each written, watched by
    the scheduler and the eviction controller, and rewritten whenever the pool changes.
    """
    desired = DesiredObjects()
    desired.cluster.append(device_class(policy))
    desired.cluster.extend(tenancy_admission(policy))
    for tenant in policy.spec.tenants:
        if tenant.namespace not in namespaces:
            continue
        desired.namespaced.append(claim_template(policy, tenant.namespace))
        if tenant.max_slices is not None:
            desired.namespaced.append(resource_quota(policy, tenant.namespace, tenant.max_slices))
    return desired


def admin_access_guard(controller_username: str) -> Manifest:
    """Only the controller may turn on the admin-access label of a namespace, so tenants
    cannot grant themselves admin access; the policies' spec.adminAccess is the one way."""
    label = "resource.kubernetes.io/admin-access"
    value = "has({o}.metadata.labels) && '{l}' in {o}.metadata.labels ? {o}.metadata.labels['{l}'] : ''"
    return {
        "apiVersion": ADMISSION_V1, "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": "gpuslice-admin-access-label", "labels": dict(MANAGED_BY)},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                "resources": ["namespaces"],
            }]},
            "variables": [
                {"name": "newValue", "expression": value.format(o="object", l=label)},
                {"name": "oldValue",
                 "expression": f"oldObject == null ? '' : ({value.format(o='oldObject', l=label)})"},
            ],
            "validations": [{
                "expression": (
                    "variables.newValue != 'true' || variables.oldValue == 'true'"
                    f" || request.userInfo.username == '{controller_username}'"
                ),
                "messageExpression": (
                    f"'namespace ' + object.metadata.name + ': only the gpuslice controller may set"
                    f" {label}=true; list the namespace in spec.adminAccess.namespaces of a"
                    " GpuSlicePolicy instead'"
                ),
                "reason": "Forbidden",
            }],
        },
    }


def admin_access_guard_binding() -> Manifest:
    return {
        "apiVersion": ADMISSION_V1, "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": "gpuslice-admin-access-label", "labels": dict(MANAGED_BY)},
        "spec": {"policyName": "gpuslice-admin-access-label", "validationActions": ["Deny"]},
    }
