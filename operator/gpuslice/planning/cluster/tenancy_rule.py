"""The tenancy rule, ``gpuslice-tenancy``: one ValidatingAdmissionPolicy that takes every
GpuSlicePolicy as its parameter (``paramKind``), so the controller writes no admission objects.

It judges each ResourceClaim and template when it is created, and each claim again when the
scheduler writes its allocation (``resourceclaims/status``): that write is the only way a claim
gets a device, so tenancy holds whatever the claim's history (made before the policy existed, or
before its namespace left ``spec.tenants``). It judges once more whenever the scheduler reserves
an allocated claim for one more pod, so a removed tenant starts no new pod on a claim it still
holds. A claim's spec is immutable, so other updates (the finalizer kube-controller-manager
removes, a pod's reservation it drops) pass, and a removed tenant can still release and delete
what it holds.

It judges only claims and templates that name one of gpuslice's DeviceClasses (``*.gpuslice.dev``,
in ``exactly`` or any ``firstAvailable`` subrequest), and only in the namespaces labelled
``gpuslice.dev/tenancy=judged``. The label is needed because the API server resolves a policy's
parameters before it evaluates its ``matchConditions`` (k8s.io/apiserver,
``admission/plugin/policy/validating/dispatcher.go``): while the GpuSlicePolicy CRD is missing, or
not yet learnt by an API server that just restarted, a rule with that parameter refuses everything
its match constraints match, whatever its match conditions say. So its ``namespaceSelector`` keeps
it to the namespaces the controller labels (every namespace a policy names, and its own), and
``gpuslice-non-tenants``, which has no parameter, refuses gpuslice's claims in every other
namespace: no policy names them, so none is a tenant. Both refuse a non-tenant; the label decides
only which rule says so, and claims of every other driver are never judged by either.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuslice.api.policy import GROUP, KIND, VERSION
from gpuslice.dra.names import (
    ATTRIBUTE_DOMAIN,
    DRIVER,
    MANAGED_BY,
    MEMORY_JUDGED,
    MEMORY_LABEL,
    TENANCY_JUDGED,
    TENANCY_LABEL,
)
from gpuslice.jsontypes import Object
from gpuslice.planning.defrag import rule as defrag_rule

ADMISSION_V1 = "admissionregistration.k8s.io/v1"
TENANCY = "gpuslice-tenancy"
NON_TENANTS = "gpuslice-non-tenants"
TENANCY_DENIAL = "is not a tenant of GpuSlicePolicy"  # what the controller's dry-run probe expects

# The three moments a claim is judged: made, allocated, reserved for one more pod. Any other update
# of a claim (its spec is immutable) is never judged. (The only UPDATE matched is of
# resourceclaims/status; request.subResource is absent, not empty, on the main resource.)
_ALLOCATING = ("(request.operation == 'UPDATE' && has(object.status) && has(object.status.allocation)"
               " && !(has(oldObject.status) && has(oldObject.status.allocation)))")
_RESERVING = ("(request.operation == 'UPDATE' && has(object.status) && has(object.status.reservedFor)"
              " && object.status.reservedFor.exists(r, !(has(oldObject.status) && has(oldObject.status.reservedFor)"
              " && oldObject.status.reservedFor.exists(o, o.uid == r.uid))))")
_JUDGED_MOMENT = f"request.operation == 'CREATE' || {_ALLOCATING} || {_RESERVING}"
_SPEC = "(request.resource.resource == 'resourceclaimtemplates' ? object.spec.spec : object.spec)"
_GPUSLICE_CLASS = f"endsWith('.{GROUP}')"
# Whether the claim or template names any of gpuslice's DeviceClasses: what scopes every rule here.
_NAMES_GPUSLICE_CLASS = (
    f"[{_SPEC}].exists(s, has(s.devices) && has(s.devices.requests) && s.devices.requests.exists(r,"
    f" (has(r.exactly) && r.exactly.deviceClassName.{_GPUSLICE_CLASS})"
    f" || (has(r.firstAvailable) && r.firstAvailable.exists(f, f.deviceClassName.{_GPUSLICE_CLASS}))))"
)


# What the maxMemory webhook's configuration matches on too (planning.cluster.memory_rule).
ALLOCATING, NAMES_GPUSLICE_CLASS = _ALLOCATING, _NAMES_GPUSLICE_CLASS


def _scope(namespaces: dict[str, Any]) -> dict[str, Any]:
    """Claims and templates made, claims allocated or reserved, in ``namespaces``, that name one of
    gpuslice's DeviceClasses: the match constraints and conditions of both rules."""
    return {
        "matchConstraints": {"matchPolicy": "Equivalent", "namespaceSelector": namespaces, "resourceRules": [
            {"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"], "operations": ["CREATE"],
             "resources": ["resourceclaims", "resourceclaimtemplates"]},
            {"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"], "operations": ["UPDATE"],
             "resources": ["resourceclaims/status"]},
        ]},
        "matchConditions": [{"name": "judged-moment", "expression": _JUDGED_MOMENT},
                            {"name": "names-a-gpuslice-class", "expression": _NAMES_GPUSLICE_CLASS}],
    }


def judged_namespaces() -> dict[str, Any]:
    return {"matchLabels": {TENANCY_LABEL: TENANCY_JUDGED}}


def other_namespaces() -> dict[str, Any]:
    """Exactly the namespaces ``judged_namespaces`` does not select (NotIn matches a missing key)."""
    return {"matchExpressions": [{"key": TENANCY_LABEL, "operator": "NotIn", "values": [TENANCY_JUDGED]}]}


def _claim_variables() -> list[tuple[str, str]]:
    """What both rules call the claim: its kind, the moment, its requests, and ``who`` for messages."""
    return [
        ("isTemplate", "request.resource.resource == 'resourceclaimtemplates'"),
        ("allocating", _ALLOCATING),
        ("reserving", _RESERVING),
        ("spec", "variables.isTemplate ? object.spec.spec : object.spec"),
        ("requests", "has(variables.spec.devices) && has(variables.spec.devices.requests)"
                     " ? variables.spec.devices.requests : []"),
        ("who", "(variables.isTemplate ? 'ResourceClaimTemplate ' : (variables.allocating"
                " ? 'allocation of ResourceClaim ' : (request.operation == 'UPDATE' ? 'a new pod of ResourceClaim '"
                " : 'ResourceClaim '))) + (has(object.metadata.name)"
                " && object.metadata.name != '' ? object.metadata.name : object.metadata.generateName)"),
    ]

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
    scalars += (f" && (has({recorded}.maxMemory) ? {recorded}.maxMemory : '')"
                f" == (has({spec}.maxMemory) ? {spec}.maxMemory : '')")
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


def _within_class(x: str) -> str:
    """Request ``x`` asks no capacity but memory, and no more of it than one allocation of its class
    stands for as the controller last put the class in force (``status.classesInForce``): in
    shared mode one sliceSize. A class not in the record is never within."""
    return (
        f"(!has({x}.capacity) || !has({x}.capacity.requests) || {x}.capacity.requests.all(c, c == 'memory'"
        f" && variables.inForce.exists(k, k.name == {x}.deviceClassName"
        f" && quantity(string({x}.capacity.requests[c])).compareTo(quantity(k.memory)) <= 0)))"
    )


def _consumed_over(res: str, klass: str) -> str:
    """Allocation result ``res`` (of a request of DeviceClass ``klass``) consumed capacity other than
    memory, or more memory than one allocation of the class stands for in force."""
    return (f"({res}.consumedCapacity.exists(k, k != 'memory' || !variables.inForce.exists(c, c.name == {klass}"
            f" && quantity(string({res}.consumedCapacity[k])).compareTo(quantity(c.memory)) <= 0)))")


# Some result of the allocation being written, of a request (or subrequest) of the policy's
# classes, consumed more than one allocation of its class stands for: what a shared device's step
# rounds a request up to is judged here, where the scheduler says what it took.
_OVER_CONSUMED = (
    "variables.allocating && has(object.status.allocation.devices) && has(object.status.allocation.devices.results)"
    " && object.status.allocation.devices.results.exists(res, has(res.consumedCapacity) && variables.requests.exists(q,"
    f" (has(q.exactly) && q.name == res.request && {_ours('q.exactly')}"
    f" && {_consumed_over('res', 'q.exactly.deviceClassName')})"
    " || (has(q.firstAvailable) && q.firstAvailable.exists(s, q.name + '/' + s.name == res.request"
    f" && {_ours('s')} && {_consumed_over('res', 's.deviceClassName')}))))"
)
_COUNTED = ("has(t.maxSlices) || has(t.maxFullGpus) || has(t.maxMigDevices)",
            "has(variables.record[0].limits.maxSlices) || has(variables.record[0].limits.maxFullGpus)"
            " || has(variables.record[0].limits.maxMigDevices)")


def tenancy_policy() -> Object:
    tenants = "(has(params.spec.tenants) ? params.spec.tenants : [])"
    variables = [
        *_claim_variables(),
        # A claim is judged in full when it is made and when it is allocated; when the scheduler
        # reserves an allocated claim for one more pod, whose namespace may still use the policy's
        # devices is judged again, so a removed tenant starts no new pod on what it holds.
        ("judged", "request.operation == 'CREATE' || variables.allocating"),
        ("used", "variables.judged || variables.reserving"),
        ("primaryClass", f"{_POLICY} + '.{GROUP}'"),
        ("classSuffix", f"'.' + {_POLICY} + '.{GROUP}'"),
        ("usesClass", _any_request(lambda _: "true")),
        ("tenant", f"{tenants}.exists(t, t.namespace == request.namespace)"),
        ("limited", f"{tenants}.exists(t, t.namespace == request.namespace && ({_COUNTED[0]}))"),
        # maxMemory, as the spec says now: charged by the webhook (planning.cluster.memory_rule), which the
        # namespace's label routes its claims to.
        ("memoryLimited", f"{tenants}.exists(t, t.namespace == request.namespace && has(t.maxMemory))"),
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
        ("limitsInForce", "!(variables.limited || variables.memoryLimited)"
                          " || (size(variables.record) > 0 && has(variables.record[0].limits)"
                          " && " + _same_limits("variables.record[0].limits", "variables.specTenant[0]") + ")"),
        ("classesInForce", "!variables.limited || (size(variables.record) > 0 && has(variables.record[0].classes)"
                           " && " + _every_request(lambda x: f"{x}.deviceClassName in variables.record[0].classes")
                           + ")"),
        ("madeUnderQuota", "!variables.limited || variables.isTemplate || (size(variables.record) > 0"
                           " && has(variables.record[0].since) && timestamp(string(object.metadata.creationTimestamp))"
                           " > timestamp(variables.record[0].since))"),
        # Limited by a count (maxSlices...) as the spec says now or as the controller last recorded:
        # taking a limit away is a loosening, and waits for the record like any other.
        ("countLimited", "variables.limited || (size(variables.record) > 0 && has(variables.record[0].limits)"
                         f" && ({_COUNTED[1]}))"),
        # A maxMemory in the spec or in force: its claims must reach the webhook, which only the
        # label routes them to (taking it off must stop no check).
        ("memoryRouted", "!(variables.memoryLimited || (size(variables.record) > 0"
                         " && has(variables.record[0].limits) && has(variables.record[0].limits.maxMemory)))"
                         " || (has(namespaceObject.metadata.labels)"
                         f" && '{MEMORY_LABEL}' in namespaceObject.metadata.labels"
                         f" && namespaceObject.metadata.labels['{MEMORY_LABEL}'] == '{MEMORY_JUDGED}')"),
        ("inForce", "has(params.status) && has(params.status.classesInForce) ? params.status.classesInForce : []"),
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
        # A tenant with a count limit is charged one device per allocation: each may take no more
        # than one device of its class stands for in force (a shared device: one sliceSize), read
        # from the controller's record, so an edit not converged yet (an invalid one, or any while
        # the controller is stalled) loosens nothing.
        ("overStep", "variables.countLimited && (" + _any_request(lambda x: "!" + _within_class(x))
                     + " || " + _OVER_CONSUMED + ")"),
        # The node the allocation is for, read as the API server reads it (nodeNameFromAllocation):
        # a selector of one term with one field, metadata.name In [node]; else ''.
        ("allocatedNode", "!variables.allocating || !has(object.status.allocation.nodeSelector)"
                          " || !has(object.status.allocation.nodeSelector.nodeSelectorTerms)"
                          " || size(object.status.allocation.nodeSelector.nodeSelectorTerms) != 1 ? '' :"
                          " [object.status.allocation.nodeSelector.nodeSelectorTerms[0]].map(t,"
                          " (has(t.matchExpressions) && size(t.matchExpressions) > 0) || !has(t.matchFields)"
                          " || size(t.matchFields) != 1 || t.matchFields[0].key != 'metadata.name'"
                          " || t.matchFields[0].operator != 'In' || !has(t.matchFields[0].values)"
                          " || size(t.matchFields[0].values) != 1 ? '' : t.matchFields[0].values[0])[0]"),
        # At allocation: the policy's devices (results of a request, or subrequest, of its classes) on
        # a pool the policy does not select, or in a pool named after another node than the one the
        # allocation is for. A node agent publishes only its own node's pool, but a compromised one
        # could publish devices claiming any policy, and a kubelet may publish a slice of its own node
        # under any pool name (NodeRestriction checks only spec.nodeName): they go only where the
        # policy's recorded nodes are (status.selectedNodes, which the controller alone writes), and
        # only from the pool of the node they are on.
        ("offNodes", "!variables.allocating || !has(object.status.allocation.devices)"
                     " || !has(object.status.allocation.devices.results) ? [] :"
                     f" object.status.allocation.devices.results.filter(x, x.driver == '{DRIVER}'"
                     " && variables.requests.exists(q, q.name == x.request.split('/')[0]"
                     f" && ((has(q.exactly) && {_ours('q.exactly')}) || (has(q.firstAvailable)"
                     " && size(x.request.split('/')) > 1"
                     f" && q.firstAvailable.exists(s, s.name == x.request.split('/')[1] && {_ours('s')}))))"
                     " && !(has(params.status) && has(params.status.selectedNodes)"
                     " && x.pool in params.status.selectedNodes && x.pool == variables.allocatedNode))"
                     ".map(x, x.pool + '/' + x.device)"),
        *defrag_rule.variables(),
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
         f" gpuslice has not put its quota in place yet (or, with maxMemory, its memory ledger; see"
         f" status.admittedTenants of the policy); try again in a moment'"),
        ("!variables.judged || !variables.usesClass || !variables.admitted || variables.isTemplate"
         " || (variables.adminNamespace && variables.onlyAdminAccess) || variables.limitsInForce",
         f"variables.who + ': the limits of namespace ' + request.namespace + ' in GpuSlicePolicy {policy}"
         f" changed, and gpuslice has not yet put them in force in its quota or memory ledger (see"
         f" status.admittedTenants of the policy); try again in a moment'"),
        ("!variables.judged || !variables.usesClass || variables.memoryRouted",
         f"variables.who + ': namespace ' + request.namespace + ' has a maxMemory in GpuSlicePolicy {policy}, but"
         f" it is not labelled {MEMORY_LABEL}={MEMORY_JUDGED}, the label that routes its claims to the maxMemory"
         f" webhook, which charges them; the gpuslice controller puts it back: try again in a moment'"),
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
         f" each allocation of its devices is at most one device of its DeviceClass, and of a shared device one"
         f" sliceSize, as the class is in force (' + variables.inForce.map(c, c.name + ': ' + c.memory).join(', ')"
         f" + '; status.classesInForce): remove capacity.requests or ask for at most that much of memory"
         f" (count: N gives N of them)'"),
        ("size(variables.offNodes) == 0",
         f"variables.who + ': devices ' + variables.offNodes.join(', ') + ' of GpuSlicePolicy {policy} are on"
         f" nodes that policy does not select (status.selectedNodes), or in a pool named after another node"
         f" than the one they are on (' + (variables.allocatedNode == '' ? 'no single node' : variables.allocatedNode)"
         f" + '): a node agent or kubelet published devices of a policy that gives its node none; they are never"
         f" allocated. If the node was just added to spec.nodeSelector, gpuslice records it in a moment'"),
    ]
    validations.append(defrag_rule.validation())  # a GPU being freed goes to the pod it is freed for
    return {
        "apiVersion": ADMISSION_V1, "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": TENANCY, "labels": dict(MANAGED_BY)},
        "spec": {
            "failurePolicy": "Fail",
            "paramKind": {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND},
            **_scope(judged_namespaces()),
            "variables": [{"name": n, "expression": e} for n, e in variables],
            "validations": [{"expression": e, "messageExpression": m, "reason": "Forbidden"} for e, m in validations],
        },
    }


def tenancy_binding() -> Object:
    """One binding for every policy: the selector matches them all, and with none there is
    nothing to enforce."""
    return {
        "apiVersion": ADMISSION_V1, "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": TENANCY, "labels": dict(MANAGED_BY)},
        "spec": {"policyName": TENANCY, "validationActions": ["Deny"],
                 "paramRef": {"selector": {}, "parameterNotFoundAction": "Allow"}},
    }


def non_tenants_policy() -> Object:
    """``gpuslice-non-tenants``: a claim or template of gpuslice's DeviceClasses in a namespace no
    policy names is refused when it is made, allocated or reserved for a pod. It has no parameter,
    so it holds (and judges nothing of anyone else's) with the GpuSlicePolicy CRD gone. The
    policy a class belongs to is read from its name: ``[<kind>.]<policy>.gpuslice.dev``, and
    policy names are DNS labels (planning.kinds)."""
    ours = f"deviceClassName.{_GPUSLICE_CLASS}"
    variables = [
        *_claim_variables(),
        ("exact", f"variables.requests.filter(r, has(r.exactly) && r.exactly.{ours})"
                  ".map(r, r.exactly.deviceClassName)"),
        ("listed", f"variables.requests.filter(r, has(r.firstAvailable) && r.firstAvailable.exists(s, s.{ours}))"
                   f".map(r, r.firstAvailable.filter(s, s.{ours})[0].deviceClassName)"),
        ("className", "size(variables.exact) > 0 ? variables.exact[0] : variables.listed[0]"),
        ("parts", "variables.className.split('.')"),
        ("policy", "variables.parts[size(variables.parts) - 3]"),
    ]
    message = (
        f"variables.who + ': namespace ' + request.namespace + ' {TENANCY_DENIAL} ' + variables.policy"
        " + ', so it may not use the DeviceClasses of that policy; ask the platform team to add it to"
        " spec.tenants of GpuSlicePolicy ' + variables.policy + ' (the gpuslice controller then labels it"
        f" {TENANCY_LABEL}={TENANCY_JUDGED}; no claim of a gpuslice DeviceClass is admitted in a namespace"
        " without that label)'"
    )
    return {
        "apiVersion": ADMISSION_V1, "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": NON_TENANTS, "labels": dict(MANAGED_BY)},
        "spec": {
            "failurePolicy": "Fail",
            **_scope(other_namespaces()),
            "variables": [{"name": n, "expression": e} for n, e in variables],
            "validations": [{"expression": "false", "messageExpression": message, "reason": "Forbidden"}],
        },
    }
