"""gpuslice's static admission policies: installed once from manifests/admission.yaml.

- ``gpuslice-tenancy`` takes every GpuSlicePolicy as its parameter (``paramKind``), so
  the controller writes no admission objects at all. It judges each ResourceClaim and
  template when it is created, and each claim again when the scheduler writes its
  allocation (``resourceclaims/status``): that write is the only way a claim gets a
  device, so tenancy holds whatever the claim's history (made before the policy
  existed, or before its namespace left ``spec.tenants``), and once more whenever the
  scheduler reserves an allocated claim for one more pod, so a removed tenant starts no new
  pod on a claim it still holds. A claim's spec is immutable, so other updates (e.g. the
  finalizer kube-controller-manager removes, a pod's reservation it drops) pass.
- ``gpuslice-admin-access-label``: only the controller may turn on a namespace's
  admin-access label, through every path that can set it.
- ``gpuslice-controller-writes``: the controller's own writes are limited to objects that
  carry gpuslice's labels and names, so its RBAC on kinds whose names vary per policy
  cannot reach anyone else's objects.
- ``gpuslice-device-classes``: gpuslice's devices are allocated only through gpuslice's
  DeviceClasses. Tenancy and limits are judged by the class a claim names, so a claim of any
  other class that happens to select gpuslice's driver (a catch-all class an administrator
  made, another vendor's class with a loose selector) would escape both. It has no parameter:
  it holds with no policy at all, and for the devices of a policy that is gone.

The controller's identity is written into the second and third: running it as another
identity means editing that username (see docs/controller.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml

from gpuslice.api.policy import GROUP, KIND, VERSION
from gpuslice.dra.names import (
    ADMIN_ACCESS_LABEL,
    ATTRIBUTE_DOMAIN,
    CONTROLLER_NAMESPACE,
    DRIVER,
    LABEL_POLICY,
    MANAGED_BY,
)

Manifest = dict[str, Any]
ADMISSION_V1 = "admissionregistration.k8s.io/v1"
CONTROLLER_USER = f"system:serviceaccount:{CONTROLLER_NAMESPACE}:gpuslice-controller"
TENANCY = "gpuslice-tenancy"
ADMIN_LABEL_GUARD = "gpuslice-admin-access-label"
CONTROLLER_WRITES = "gpuslice-controller-writes"
DEVICE_CLASSES = "gpuslice-device-classes"
STATIC_POLICIES = (TENANCY, ADMIN_LABEL_GUARD, CONTROLLER_WRITES, DEVICE_CLASSES)
TENANCY_DENIAL = "is not a tenant of GpuSlicePolicy"  # what the controller's dry-run probe expects

_POLICY = "params.metadata.name"


def _ours(x: str) -> str:
    """Whether request (or subrequest) ``x`` names a DeviceClass of the parameter policy."""
    return f"({x}.deviceClassName == variables.primaryClass || {x}.deviceClassName.endsWith(variables.classSuffix))"


def _any_request(predicate: Callable[[str], str]) -> str:
    """Some request of the policy's classes (exactly, or a subrequest of firstAvailable) for which
    ``predicate`` (given the request's CEL name) holds."""
    return (
        f"variables.requests.exists(r, (has(r.exactly) && {_ours('r.exactly')} && {predicate('r.exactly')})"
        f" || (has(r.firstAvailable) && r.firstAvailable.exists(s, {_ours('s')} && {predicate('s')})))"
    )


def _every_request(predicate: Callable[[str], str]) -> str:
    """Every request of the policy's classes (exactly, or a subrequest of firstAvailable) satisfies
    ``predicate``."""
    return (
        f"variables.requests.all(r, (!has(r.exactly) || !{_ours('r.exactly')} || {predicate('r.exactly')})"
        f" && (!has(r.firstAvailable) || r.firstAvailable.all(s, !{_ours('s')} || {predicate('s')})))"
    )


def _same_limits(recorded: str, spec: str) -> str:
    """The recorded limits equal the spec's: each field absent from both or equal in both."""
    scalars = " && ".join(f"(has({recorded}.{f}) ? {recorded}.{f} : -1) == (has({spec}.{f}) ? {spec}.{f} : -1)"
                          for f in ("maxSlices", "maxFullGpus"))
    mig = "maxMigDevices"
    maps = (f"has({recorded}.{mig}) == has({spec}.{mig}) && (!has({spec}.{mig})"
            f" || (size({recorded}.{mig}) == size({spec}.{mig})"
            f" && {spec}.{mig}.all(k, k in {recorded}.{mig} && {recorded}.{mig}[k] == {spec}.{mig}[k])))")
    return f"{scalars} && {maps}"


def _bad_toleration(t: str) -> str:
    """A toleration tenants may not have: of everything, of a gpuslice.dev/ key that is not one of
    the policy's taints, or of a policy taint that is not tolerable."""
    return (
        f"(!has({t}.key) || {t}.key == ''"
        f" || ({t}.key.startsWith('{ATTRIBUTE_DOMAIN}/') && !variables.taints.exists(k, k.key == {t}.key))"
        f" || variables.taints.exists(k, k.key == {t}.key && !(has(k.tolerable) && k.tolerable)"
        f" && (!has({t}.effect) || {t}.effect == '' || {t}.effect == k.effect)))"
    )


def _capacity_within_step(x: str) -> str:
    return (
        f"(!has({x}.capacity) || !has({x}.capacity.requests) || {x}.capacity.requests.all(c, c == 'memory'"
        f" && quantity(string({x}.capacity.requests[c])).compareTo(quantity(params.spec.slicing.sliceSize)) <= 0))"
    )


def tenancy_policy() -> Manifest:
    tenants = "(has(params.spec.tenants) ? params.spec.tenants : [])"
    variables = [
        ("isTemplate", "request.resource.resource == 'resourceclaimtemplates'"),
        # The only UPDATE matched is of resourceclaims/status (request.subResource is absent, not
        # empty, on the main resource).
        ("allocating", "request.operation == 'UPDATE' && has(object.status) && has(object.status.allocation)"
                       " && !(has(oldObject.status) && has(oldObject.status.allocation))"),
        # A claim is judged when it is made and when it is allocated; any other update of it (its
        # spec is immutable) passes, so a claim of a removed tenant can still be released and deleted.
        ("judged", "request.operation == 'CREATE' || variables.allocating"),
        # The scheduler reserving an allocated claim for one more pod: whose namespace may still use
        # the policy's devices is judged again, so a removed tenant starts no new pod on what it holds.
        ("reserving", "request.operation == 'UPDATE' && has(object.status) && has(object.status.reservedFor)"
                      " && object.status.reservedFor.exists(r, !(has(oldObject.status)"
                      " && has(oldObject.status.reservedFor)"
                      " && oldObject.status.reservedFor.exists(o, o.uid == r.uid)))"),
        ("used", "variables.judged || variables.reserving"),
        ("spec", "variables.isTemplate ? object.spec.spec : object.spec"),
        ("requests", "has(variables.spec.devices) && has(variables.spec.devices.requests)"
                     " ? variables.spec.devices.requests : []"),
        ("primaryClass", f"{_POLICY} + '.{GROUP}'"),
        ("classSuffix", f"'.' + {_POLICY} + '.{GROUP}'"),
        ("usesClass", _any_request(lambda _: "true")),
        ("tenant", f"{tenants}.exists(t, t.namespace == request.namespace)"),
        ("limited", f"{tenants}.exists(t, t.namespace == request.namespace"
                    " && (has(t.maxSlices) || has(t.maxFullGpus) || has(t.maxMigDevices)))"),
        ("specTenant", f"{tenants}.filter(t, t.namespace == request.namespace)"),
        # Only the namespaces the controller admitted, by UID: a tenant added a moment ago, or a
        # tenant namespace deleted and made again, waits for its quota. (dyn: the apiserver declares
        # the field "UID" but serves it as "uid".)
        ("record", "has(params.status) && has(params.status.admittedTenants)"
                   " ? params.status.admittedTenants.filter(a, a.namespace == request.namespace"
                   " && a.uid == dyn(namespaceObject.metadata).uid) : []"),
        ("admitted", "variables.tenant && size(variables.record) > 0"),
        # A limited tenant's record says which limits its quota enforces, which classes it counts, and
        # since when: claims are admitted only under the limits the spec says now, of a class counted,
        # and (at allocation) only if made after the quota, which alone guarantees they were counted.
        ("limitsInForce", "!variables.limited || (size(variables.record) > 0 && has(variables.record[0].limits)"
                          " && " + _same_limits("variables.record[0].limits", "variables.specTenant[0]") + ")"),
        ("classesInForce", "!variables.limited || (size(variables.record) > 0 && has(variables.record[0].classes)"
                           " && " + _every_request(lambda x: f"{x}.deviceClassName in variables.record[0].classes")
                           + ")"),
        ("madeUnderQuota", "!variables.limited || variables.isTemplate || (size(variables.record) > 0"
                           " && has(variables.record[0].since) && timestamp(string(object.metadata.creationTimestamp))"
                           " > timestamp(variables.record[0].since))"),
        ("adminNamespace", "has(params.spec.adminAccess) && has(params.spec.adminAccess.namespaces)"
                           " && request.namespace in params.spec.adminAccess.namespaces"),
        ("wantsAdminAccess", "variables.requests.exists(r, has(r.exactly) && " + _ours("r.exactly")
                             + " && has(r.exactly.adminAccess) && r.exactly.adminAccess)"),
        ("onlyAdminAccess", "variables.requests.all(r, !(has(r.firstAvailable) && r.firstAvailable.exists(s, "
                            + _ours("s") + ")) && (!(has(r.exactly) && " + _ours("r.exactly")
                            + ") || (has(r.exactly.adminAccess) && r.exactly.adminAccess)))"),
        ("taints", "has(params.spec.taints) ? params.spec.taints : []"),
        ("badToleration", _any_request(
            lambda x: f"has({x}.tolerations) && {x}.tolerations.exists(t, {_bad_toleration('t')})")),
        ("overStep", "params.spec.slicing.mode == 'shared' && variables.limited && "
                     + _any_request(lambda x: "!" + _capacity_within_step(x))),
        ("who", "(variables.isTemplate ? 'ResourceClaimTemplate ' : (variables.allocating"
                " ? 'allocation of ResourceClaim ' : (request.operation == 'UPDATE' ? 'a new pod of ResourceClaim '"
                " : 'ResourceClaim '))) + (has(object.metadata.name)"
                " && object.metadata.name != '' ? object.metadata.name : object.metadata.generateName)"),
    ]
    policy = f"' + {_POLICY} + '"
    validations = [
        ("!variables.used || !variables.usesClass || variables.tenant || variables.adminNamespace",
         f"variables.who + ': namespace ' + request.namespace + ' {TENANCY_DENIAL} {policy}, so it may not use"
         f" the DeviceClasses of that policy; ask the platform team to add it to spec.tenants of GpuSlicePolicy"
         f" {policy}'"),
        ("!variables.judged || !variables.usesClass || !variables.tenant || variables.isTemplate"
         " || variables.admitted || (variables.adminNamespace && variables.onlyAdminAccess)",
         f"variables.who + ': namespace ' + request.namespace + ' is a tenant of GpuSlicePolicy {policy}, but"
         f" gpuslice has not put its quota in place yet (see status.admittedTenants of the policy); try again"
         f" in a moment'"),
        ("!variables.judged || !variables.usesClass || !variables.admitted || variables.isTemplate"
         " || (variables.adminNamespace && variables.onlyAdminAccess) || variables.limitsInForce",
         f"variables.who + ': the limits of namespace ' + request.namespace + ' in GpuSlicePolicy {policy}"
         f" changed, and gpuslice has not yet put them in force in its quota (see status.admittedTenants of the"
         f" policy); try again in a moment'"),
        ("!variables.judged || !variables.usesClass || !variables.admitted || variables.isTemplate"
         " || (variables.adminNamespace && variables.onlyAdminAccess) || !variables.limitsInForce"
         " || variables.classesInForce",
         f"variables.who + ': the quota of namespace ' + request.namespace + ' for GpuSlicePolicy {policy}"
         f" does not count this DeviceClass yet (a kind of device the policy does not offer, or offers only"
         f" since a moment ago; it counts ' + variables.record[0].classes.join(', ') + '); ask for one of"
         f" those, or try again once the policy offers it'"),
        ("!variables.judged || !variables.usesClass || !variables.admitted || variables.isTemplate"
         " || (variables.adminNamespace && variables.onlyAdminAccess) || !variables.limitsInForce"
         " || !variables.classesInForce || variables.madeUnderQuota",
         f"variables.who + ': the claim was made before the quota of namespace ' + request.namespace + ' for"
         f" GpuSlicePolicy {policy} existed (' + variables.record[0].since + '), so that quota never counted"
         f" it and it is never allocated: delete it and make it again'"),
        ("!variables.used || !variables.usesClass || variables.tenant || !variables.adminNamespace"
         " || variables.onlyAdminAccess",
         f"variables.who + ': namespace ' + request.namespace + ' may use devices of GpuSlicePolicy {policy}"
         f" only with adminAccess: true (it is one of spec.adminAccess.namespaces, not of spec.tenants)'"),
        ("!variables.used || !variables.wantsAdminAccess || variables.adminNamespace",
         f"variables.who + ': namespace ' + request.namespace + ' may not request adminAccess to devices of"
         f" GpuSlicePolicy {policy}; only spec.adminAccess.namespaces of that policy may'"),
        ("!variables.judged || !variables.badToleration",
         f"variables.who + ': a request for devices of GpuSlicePolicy {policy} tolerates a taint that tenants"
         f" may not tolerate: every taint (operator Exists without a key), the taints gpuslice sets"
         f" ({ATTRIBUTE_DOMAIN}/pending-change and every other {ATTRIBUTE_DOMAIN}/ key: devices held back,"
         f" draining, reconfiguring or unhealthy), or a taint of spec.taints without tolerable: true;"
         f" remove that toleration'"),
        ("!variables.judged || !variables.overStep",
         f"variables.who + ': namespace ' + request.namespace + ' has a limit in GpuSlicePolicy {policy}, so"
         f" each allocation of its shared devices is one sliceSize (' + params.spec.slicing.sliceSize + '):"
         f" remove capacity.requests or ask for at most that much of memory (count: N gives N of them)'"),
    ]
    return {
        "apiVersion": ADMISSION_V1, "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": TENANCY, "labels": dict(MANAGED_BY)},
        "spec": {
            "failurePolicy": "Fail",
            "paramKind": {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND},
            "matchConstraints": {
                "matchPolicy": "Equivalent",
                "resourceRules": [
                    {"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"], "operations": ["CREATE"],
                     "resources": ["resourceclaims", "resourceclaimtemplates"]},
                    {"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"], "operations": ["UPDATE"],
                     "resources": ["resourceclaims/status"]},
                ],
            },
            "variables": [{"name": n, "expression": e} for n, e in variables],
            "validations": [{"expression": e, "messageExpression": m, "reason": "Forbidden"} for e, m in validations],
        },
    }


def tenancy_binding() -> Manifest:
    """One binding for every policy: the selector matches them all, and with none there is
    nothing to enforce."""
    return {
        "apiVersion": ADMISSION_V1, "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": TENANCY, "labels": dict(MANAGED_BY)},
        "spec": {"policyName": TENANCY, "validationActions": ["Deny"],
                 "paramRef": {"selector": {}, "parameterNotFoundAction": "Allow"}},
    }


def admin_access_guard(controller_user: str = CONTROLLER_USER) -> Manifest:
    """Only the controller may turn on the admin-access label of a namespace, so tenants cannot
    grant themselves admin access; the policies' spec.adminAccess is the one way. The label can be
    set through the namespace, its status and its finalize subresources: all are guarded."""
    value = ("has({o}.metadata.labels) && '{l}' in {o}.metadata.labels ? {o}.metadata.labels['{l}'] : ''")
    return {
        "apiVersion": ADMISSION_V1, "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": ADMIN_LABEL_GUARD, "labels": dict(MANAGED_BY)},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                "resources": ["namespaces", "namespaces/status", "namespaces/finalize"],
            }]},
            "variables": [
                {"name": "newValue", "expression": value.format(o="object", l=ADMIN_ACCESS_LABEL)},
                {"name": "oldValue",
                 "expression": f"oldObject == null ? '' : ({value.format(o='oldObject', l=ADMIN_ACCESS_LABEL)})"},
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


def controller_writes(controller_user: str = CONTROLLER_USER) -> Manifest:
    """What the controller may write, beyond what RBAC can say: objects of kinds whose names vary
    per policy only when they are gpuslice's (labels and names, before and after), namespaces only
    in their admin-access label, ResourceClaims only as a dry run (its tenancy probe)."""
    owned_kinds = ["deviceclasses", "resourceclaimtemplates", "devicetaintrules", "resourcequotas"]
    labels = "has({o}.metadata.labels) ? {o}.metadata.labels : {{}}"
    annotations = "has({o}.metadata.annotations) ? {o}.metadata.annotations : {{}}"
    label = ADMIN_ACCESS_LABEL
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
            ]},
            "matchConditions": [{"name": "is-gpuslice-controller",
                                 "expression": f"request.userInfo.username == '{controller_user}'"}],
            "variables": [
                {"name": "owns", "expression": f"request.resource.resource in {owned_kinds}"},
                {"name": "target", "expression": "request.operation == 'DELETE' ? oldObject : object"},
                {"name": "name", "expression": "variables.target.metadata.name"},
                {"name": "newLabels", "expression": labels.format(o="object")},
                {"name": "oldLabels", "expression": labels.format(o="oldObject")},
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
                                f"variables.newLabels.all(k, k == '{label}' || (k in variables.oldLabels"
                                " && variables.oldLabels[k] == variables.newLabels[k]))"
                                f" && variables.oldLabels.all(k, k == '{label}' || k in variables.newLabels)"
                                f" && ({annotations.format(o='object')}) == ({annotations.format(o='oldObject')}))"),
                 "messageExpression": ("'the gpuslice controller may change only the label"
                                       f" {label} of namespace ' + variables.name"),
                 "reason": "Forbidden"},
                {"expression": "request.resource.resource != 'resourceclaims' || request.dryRun",
                 "message": "the gpuslice controller may create ResourceClaims only as a dry run (its tenancy probe)",
                 "reason": "Forbidden"},
            ],
        },
    }


def device_classes_policy() -> Manifest:
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
            "matchConditions": [{"name": "allocates", "expression": (
                "has(object.status) && has(object.status.allocation) && has(object.status.allocation.devices)"
                " && has(object.status.allocation.devices.results)"
                " && !(has(oldObject.status) && has(oldObject.status.allocation))")}],
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


def binding(policy: str) -> Manifest:
    return {
        "apiVersion": ADMISSION_V1, "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": policy, "labels": dict(MANAGED_BY)},
        "spec": {"policyName": policy, "validationActions": ["Deny"]},
    }


def static_manifests(controller_user: str = CONTROLLER_USER) -> list[Manifest]:
    return [tenancy_policy(), tenancy_binding(), admin_access_guard(controller_user), binding(ADMIN_LABEL_GUARD),
            controller_writes(controller_user), binding(CONTROLLER_WRITES),
            device_classes_policy(), binding(DEVICE_CLASSES)]


def admission_yaml(controller_user: str = CONTROLLER_USER) -> str:
    header = (
        "# Generated from operator/gpuslice/planning/admission.py by `make crds`; do not edit here.\n"
        "# gpuslice's admission policies: tenancy (every GpuSlicePolicy is a parameter), the admin-access\n"
        "# label guard, the limits on the controller's own writes, and gpuslice's devices only through\n"
        "# gpuslice's DeviceClasses. Apply after crds/: with the\n"
        "# GpuSlicePolicy CRD missing, the tenancy policy refuses every ResourceClaim (it fails closed).\n"
        f"# The controller's identity, {controller_user}, is named in the second and third:\n"
        "# to run it as another identity, replace that username (docs/controller.md).\n"
    )
    documents = [yaml.safe_dump(m, sort_keys=False, width=100) for m in static_manifests(controller_user)]
    return header + "---\n".join(documents)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Print gpuslice's admission policies (manifests/admission.yaml).")
    parser.add_argument("--controller-user", default=CONTROLLER_USER,
                        help=f"the username the controller runs as (default {CONTROLLER_USER})")
    print(admission_yaml(parser.parse_args().controller_user), end="")
