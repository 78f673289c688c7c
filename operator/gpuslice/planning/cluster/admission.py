"""gpuslice's static admission policies: installed once from manifests/admission.yaml.

Each judges only what concerns gpuslice (its ``matchConditions``, and for the one with a parameter
its ``namespaceSelector``): every other claim, allocation, namespace and object in the cluster is
never evaluated, and never refused when gpuslice, its controller or its CRD is missing.

- ``gpuslice-tenancy`` (``planning/cluster/tenancy_rule.py``): who may use each policy's devices, and
  within which limits; every GpuSlicePolicy is its parameter. It judges the namespaces labelled
  ``gpuslice.dev/tenancy=judged``, and ``gpuslice-non-tenants`` (no parameter) refuses gpuslice's
  claims in every other namespace (the module says why it takes two).
- ``gpuslice-admin-access-label``: only the controller may turn on a namespace's
  admin-access label, through every path that can set it.
- ``gpuslice-controller-writes``: the controller's own writes are limited to objects that
  carry gpuslice's labels and names, so its RBAC on kinds whose names vary per policy
  cannot reach anyone else's objects (and Secrets to the maxMemory webhook's two).
- ``gpuslice-device-classes``: gpuslice's devices are allocated only through gpuslice's
  DeviceClasses. Tenancy and limits are judged by the class a claim names, so a claim of any
  other class that happens to select gpuslice's driver (a catch-all class an administrator
  made, another vendor's class with a loose selector) would escape both. It has no parameter:
  it holds with no policy at all, and for the devices of a policy that is gone.
- ``gpuslice-policy-status`` (``planning/cluster/policy_status_rule.py``): every writer of a
  policy's status but the controller may only record or remove defragmentation moves there, never
  the records tenancy and limits are judged against.

The controller's identity is written into the admin-access guard, the controller's write limits and
the status guard: running it as another identity means editing that username (see
docs/controller.md).
"""

from __future__ import annotations

import yaml

from gpuslice.api.policy import GROUP
from gpuslice.dra.names import (
    ADMIN_ACCESS_LABEL,
    CONTROLLER_NAMESPACE,
    DRIVER,
    LABEL_POLICY,
    MANAGED_BY,
    MEMORY_LABEL,
    MEMORY_WEBHOOK_CA,
    MEMORY_WEBHOOK_TLS,
    TENANCY_JUDGED,
    TENANCY_LABEL,
)
from gpuslice.jsontypes import Object
from gpuslice.planning.cluster.policy_status_rule import POLICY_STATUS, policy_status_guard
from gpuslice.planning.cluster.tenancy_rule import (
    ADMISSION_V1,
    NON_TENANTS,
    TENANCY,
    non_tenants_policy,
    tenancy_binding,
    tenancy_policy,
)

CONTROLLER_USER = f"system:serviceaccount:{CONTROLLER_NAMESPACE}:gpuslice-controller"
ADMIN_LABEL_GUARD = "gpuslice-admin-access-label"
CONTROLLER_WRITES = "gpuslice-controller-writes"
DEVICE_CLASSES = "gpuslice-device-classes"
STATIC_POLICIES = (TENANCY, NON_TENANTS, ADMIN_LABEL_GUARD, CONTROLLER_WRITES, DEVICE_CLASSES, POLICY_STATUS)


def admin_access_guard(controller_user: str = CONTROLLER_USER) -> Object:
    """Only the controller may turn on the admin-access label of a namespace, so tenants cannot
    grant themselves admin access; the policies' spec.adminAccess is the one way. The label can be
    set through the namespace, its status and its finalize subresources: all are guarded."""
    value = ("has({o}.metadata.labels) && '{l}' in {o}.metadata.labels ? {o}.metadata.labels['{l}'] : ''")
    new = value.format(o="object", l=ADMIN_ACCESS_LABEL)
    old = f"oldObject == null ? '' : ({value.format(o='oldObject', l=ADMIN_ACCESS_LABEL)})"
    return {
        "apiVersion": ADMISSION_V1, "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": ADMIN_LABEL_GUARD, "labels": dict(MANAGED_BY)},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                "resources": ["namespaces", "namespaces/status", "namespaces/finalize"],
            }]},
            # Only a write that turns the label on is judged: every other namespace write never is.
            "matchConditions": [{"name": "turns-admin-access-on",
                                 "expression": f"({new}) == 'true' && ({old}) != 'true'"}],
            "variables": [
                {"name": "newValue", "expression": new},
                {"name": "oldValue", "expression": old},
            ],
            "validations": [{
                "expression": (
                    "variables.newValue != 'true' || variables.oldValue == 'true'"
                    f" || request.userInfo.username == '{controller_user}'"
                ),
                "messageExpression": (
                    f"'namespace ' + object.metadata.name + ': only the gpuslice controller may set"
                    f" {ADMIN_ACCESS_LABEL}=true; list the namespace in spec.adminAccess.namespaces of a"
                    " GpuSlicePolicy instead'"
                ),
                "reason": "Forbidden",
            }],
        },
    }


def _owned(o: str) -> str:
    managed_by, value = next(iter(MANAGED_BY.items()))
    return (f"(has({o}.metadata.labels) && '{LABEL_POLICY}' in {o}.metadata.labels"
            f" && '{managed_by}' in {o}.metadata.labels && {o}.metadata.labels['{managed_by}'] == '{value}')")


def controller_writes(controller_user: str = CONTROLLER_USER) -> Object:
    """What the controller may write, beyond what RBAC can say: objects of kinds whose names vary
    per policy only when they are gpuslice's (labels and names, before and after), namespaces only
    in their admin-access label, ResourceClaims only as a dry run (its tenancy probe), evictions
    only in the namespaces a policy names (defragmentation, overusing pods), Events only there and
    in default."""
    owned_kinds = ["deviceclasses", "resourceclaimtemplates", "devicetaintrules", "resourcequotas", "gpusliceledgers"]
    secrets = [MEMORY_WEBHOOK_CA, MEMORY_WEBHOOK_TLS]
    labels = "has({o}.metadata.labels) ? {o}.metadata.labels : {{}}"
    annotations = "has({o}.metadata.annotations) ? {o}.metadata.annotations : {{}}"
    mine = [ADMIN_ACCESS_LABEL, TENANCY_LABEL, MEMORY_LABEL]
    return {
        "apiVersion": ADMISSION_V1, "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": CONTROLLER_WRITES, "labels": dict(MANAGED_BY)},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"matchPolicy": "Equivalent", "resourceRules": [
                {"apiGroups": ["resource.k8s.io"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE", "DELETE"],
                 "resources": ["deviceclasses", "resourceclaimtemplates", "devicetaintrules"]},
                {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE", "DELETE"],
                 "resources": ["resourcequotas"]},
                {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["namespaces"]},
                {"apiGroups": ["resource.k8s.io"], "apiVersions": ["*"], "operations": ["CREATE"],
                 "resources": ["resourceclaims"]},
                {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE", "DELETE"],
                 "resources": ["secrets"]},
                {"apiGroups": [GROUP], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE", "DELETE"],
                 "resources": ["gpusliceledgers"]},
                # Evictions (defragmentation, overusing pods), and Events on the pods it moves, frees a GPU for
                # or finds overusing.
                {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods/eviction"]},
                {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["events"]},
            ]},
            "matchConditions": [{"name": "is-gpuslice-controller",
                                 "expression": f"request.userInfo.username == '{controller_user}'"}],
            "variables": [
                {"name": "owns", "expression": f"request.resource.resource in {owned_kinds}"},
                {"name": "target", "expression": "request.operation == 'DELETE' ? oldObject : object"},
                {"name": "name", "expression": "variables.target.metadata.name"},
                {"name": "newLabels", "expression": labels.format(o="object")},
                {"name": "oldLabels", "expression": labels.format(o="oldObject")},
                {"name": "tenantNamespace", "expression": (
                    f"namespaceObject != null && has(namespaceObject.metadata.labels) && '{TENANCY_LABEL}' in"
                    f" namespaceObject.metadata.labels && namespaceObject.metadata.labels['{TENANCY_LABEL}']"
                    f" == '{TENANCY_JUDGED}'")},
            ],
            "validations": [
                {"expression": "!variables.owns || (" + _owned("variables.target")
                               + " && (request.operation == 'CREATE' || " + _owned("oldObject") + "))",
                 "messageExpression": ("'the gpuslice controller may write only objects labelled"
                                       f" {LABEL_POLICY} and {next(iter(MANAGED_BY))}=gpuslice, not '"
                                       " + request.resource.resource + ' ' + variables.name"),
                 "reason": "Forbidden"},
                {"expression": (f"(request.resource.resource != 'deviceclasses' || variables.name.endsWith('.{GROUP}'))"
                                " && (!(request.resource.resource in ['devicetaintrules', 'resourcequotas'])"
                                " || variables.name.startsWith('gpuslice-'))"),
                 "messageExpression": ("'the gpuslice controller may write only its own names (DeviceClasses"
                                       f" *.{GROUP}, quotas and taint rules gpuslice-*), not ' + variables.name"),
                 "reason": "Forbidden"},
                {"expression": ("request.resource.resource != 'namespaces' || ("
                                f"variables.newLabels.all(k, k in {mine} || (k in variables.oldLabels"
                                " && variables.oldLabels[k] == variables.newLabels[k]))"
                                f" && variables.oldLabels.all(k, k in {mine} || k in variables.newLabels)"
                                f" && ({annotations.format(o='object')}) == ({annotations.format(o='oldObject')}))"),
                 "messageExpression": ("'the gpuslice controller may change only the labels"
                                       f" {' and '.join(mine)} of namespace ' + variables.name"),
                 "reason": "Forbidden"},
                {"expression": f"request.resource.resource != 'secrets' || variables.name in {secrets}",
                 "messageExpression": ("'the gpuslice controller may write only the Secrets of the maxMemory"
                                       f" webhook ({', '.join(secrets)}), not ' + variables.name"),
                 "reason": "Forbidden"},
                {"expression": "request.resource.resource != 'resourceclaims' || request.dryRun",
                 "message": "the gpuslice controller may create ResourceClaims only as a dry run (its tenancy probe)",
                 "reason": "Forbidden"},
                {"expression": "request.resource.resource != 'pods' || variables.tenantNamespace",
                 "messageExpression": ("'the gpuslice controller may evict pods only in the namespaces a policy names"
                                       f" (labelled {TENANCY_LABEL}={TENANCY_JUDGED}), not in ' + request.namespace"),
                 "reason": "Forbidden"},
                {"expression": ("request.resource.resource != 'events' || request.namespace == 'default'"
                                " || variables.tenantNamespace"),
                 "messageExpression": ("'the gpuslice controller may post Events only in default and in the namespaces"
                                       " a policy names, not in ' + request.namespace"),
                 "reason": "Forbidden"},
            ],
        },
    }


def device_classes_policy() -> Object:
    """Every allocation of one of gpuslice's devices answers a request (or subrequest) for one
    of gpuslice's DeviceClasses (``*.gpuslice.dev``), whose tenancy rule then judges it."""
    ours = f"endsWith('.{GROUP}')"
    answered = (
        "variables.requests.exists(q, q.name == r.request.split('/')[0] && (r.request.contains('/')"
        " ? has(q.firstAvailable) && q.firstAvailable.exists(s, s.name == r.request.split('/')[1]"
        f" && s.deviceClassName.{ours})"
        f" : has(q.exactly) && q.exactly.deviceClassName.{ours}))"
    )
    return {
        "apiVersion": ADMISSION_V1, "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": DEVICE_CLASSES, "labels": dict(MANAGED_BY)},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"matchPolicy": "Equivalent", "resourceRules": [
                {"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"], "operations": ["UPDATE"],
                 "resources": ["resourceclaims/status"]},
            ]},
            # Only an allocation of gpuslice's devices is judged: every other claim write never is.
            "matchConditions": [{"name": "allocates-gpuslice-devices", "expression": (
                "has(object.status) && has(object.status.allocation) && has(object.status.allocation.devices)"
                " && has(object.status.allocation.devices.results)"
                " && !(has(oldObject.status) && has(oldObject.status.allocation))"
                f" && object.status.allocation.devices.results.exists(r, r.driver == '{DRIVER}')")}],
            "variables": [
                {"name": "requests", "expression": "has(object.spec.devices) && has(object.spec.devices.requests)"
                                                   " ? object.spec.devices.requests : []"},
                {"name": "strays", "expression": (
                    f"object.status.allocation.devices.results.filter(r, r.driver == '{DRIVER}' && !{answered})")},
            ],
            "validations": [{
                "expression": "size(variables.strays) == 0",
                "messageExpression": (
                    "'allocation of ResourceClaim ' + object.metadata.name + ': devices of driver"
                    f" {DRIVER} (' + variables.strays.map(r, r.pool + '/' + r.device).join(', ') + ') are"
                    f" allocated only through the DeviceClasses of a GpuSlicePolicy (*.{GROUP}), where its"
                    " tenancy and limits apply; request one of those, not a DeviceClass that merely selects"
                    " the driver'"),
                "reason": "Forbidden",
            }],
        },
    }


def binding(policy: str) -> Object:
    return {
        "apiVersion": ADMISSION_V1, "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": policy, "labels": dict(MANAGED_BY)},
        "spec": {"policyName": policy, "validationActions": ["Deny"]},
    }


def static_manifests(controller_user: str = CONTROLLER_USER) -> list[Object]:
    return [tenancy_policy(), tenancy_binding(), non_tenants_policy(), binding(NON_TENANTS),
            admin_access_guard(controller_user), binding(ADMIN_LABEL_GUARD),
            controller_writes(controller_user), binding(CONTROLLER_WRITES),
            device_classes_policy(), binding(DEVICE_CLASSES),
            policy_status_guard(controller_user), binding(POLICY_STATUS)]


def admission_yaml(controller_user: str = CONTROLLER_USER) -> str:
    header = (
        "# Generated from operator/gpuslice/planning/cluster/admission.py by `make crds`; do not edit here.\n"
        "# gpuslice's admission policies: tenancy (every GpuSlicePolicy is a parameter; it judges the\n"
        "# namespaces labelled gpuslice.dev/tenancy=judged), gpuslice's claims refused in every other\n"
        "# namespace, the admin-access label guard, the limits on the controller's own writes, and\n"
        "# gpuslice's devices only through gpuslice's DeviceClasses, and a policy's status written by the\n"
        "# controller only (others may record defragmentation moves). Each judges only gpuslice's claims,\n"
        "# allocations and policies (matchConditions): with gpuslice's CRD or controller missing, every\n"
        "# other claim in the cluster is still admitted. Apply after crds/.\n"
        f"# The controller's identity, {controller_user}, is named in the admin-access\n"
        "# label guard, the controller's write limits and the status guard: to run it as another\n"
        "# identity, replace that username (docs/controller.md).\n"
    )
    documents = [yaml.safe_dump(m, sort_keys=False, width=100) for m in static_manifests(controller_user)]
    return header + "---\n".join(documents)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Print gpuslice's admission policies (manifests/admission.yaml).")
    parser.add_argument("--controller-user", default=CONTROLLER_USER,
                        help=f"the username the controller runs as (default {CONTROLLER_USER})")
    print(admission_yaml(parser.parse_args().controller_user), end="")
