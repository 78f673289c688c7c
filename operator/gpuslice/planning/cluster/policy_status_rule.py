"""Who may write what of a GpuSlicePolicy's status: the controller all of it, everyone else only
the moves of ``status.defragmentation.inFlight``.

RBAC grants a subresource whole: ``patch`` on ``gpuslicepolicies/status``, which ``gpuslice defrag
--apply`` needs to record a move (the ClusterRole ``gpuslice-defrag``), would also let its holder
rewrite the records that limits are judged against (``classesInForce``, ``admittedTenants``,
``selectedNodes``) and the Auto eviction budget. Before the second December review an identity
with only ``gpuslice-viewer`` and ``gpuslice-defrag`` raised a class's record from 10G to 80G, and
a ``maxSlices: 1`` tenant was allocated 80G before the controller put the record back. So this
rule confines every writer but the controller to what the command writes:

- every field of the status but ``defragmentation`` unchanged, and of ``defragmentation`` all but
  ``inFlight`` (the eviction budget, the last outcome);
- in ``inFlight``, a move already there kept as it is or removed (the command removes one nobody
  carried out), and a new move only as a request (phase ``Requested``, nothing evicted yet): what
  happens next is the controller's to write. A request counts for nothing (no taint, no
  reservation, no eviction) until the controller has judged it and moved it on
  (``planning.defrag.request``: the rule cannot read claims, pods or the time);
- what a request's form can say, bounded here all the same: its GPU's node one of the policy's
  ``selectedNodes``, its claim, pod and evictions in the policy's tenant namespaces (the claim's
  and pod's the same one), and at most ``MAX_REQUESTED_MOVE`` from its start to its expiry (the
  controller bounds it again by its own ``--defrag-timeout`` and clock, as CEL here has none).

Why an admission rule rather than a request object of its own: the tenancy rule reads the moves
from the policy (its parameter), so a request elsewhere would still be copied into this status by
the controller, and the field would still need guarding from the same writers. The fields are
listed from the status model, so one added to it is guarded without anyone remembering to.
"""

from __future__ import annotations

import typing

from pydantic import BaseModel

from gpuslice.api.policy import GROUP
from gpuslice.api.status import MAX_REQUESTED_MOVE, DefragmentationStatus, GpuSlicePolicyStatus
from gpuslice.dra.names import MANAGED_BY
from gpuslice.jsontypes import Object
from gpuslice.planning.cluster.tenancy_rule import ADMISSION_V1

POLICY_STATUS = "gpuslice-policy-status"
_MOVES = "status.defragmentation.inFlight"


def _fields(model: type[BaseModel], leave_out: str, prefix: str = "") -> list[tuple[str, bool]]:
    """(path, whether it is a list) of each field of ``model`` but ``leave_out``."""
    return [(prefix + (field.alias or name), typing.get_origin(field.annotation) is list)
            for name, field in model.model_fields.items() if name != leave_out]


def guarded_fields() -> list[tuple[str, bool]]:
    """The paths of the status (below ``status.``) that only the controller may change, and whether
    each is a list (absent and empty are the same list: writers leave an empty one out, or not)."""
    return [*_fields(GpuSlicePolicyStatus, "defragmentation"),
            *_fields(DefragmentationStatus, "in_flight", "defragmentation.")]


def _optional(root: str, path: str) -> str:
    """``root.status.<path>`` as a CEL optional: none where the field (or one above it) is absent."""
    return f"{root}.?status" + "".join(f".?{part}" for part in path.split("."))


def _value(root: str, path: str, listed: bool) -> str:
    return _optional(root, path) + (".orValue([])" if listed else "")


def _changed() -> str:
    """The guarded fields an update changes, as a CEL list of their paths."""
    return " + ".join(f"({_value('object', p, listed)} == {_value('oldObject', p, listed)} ? [] : ['status.{p}'])"
                      for p, listed in guarded_fields())


def policy_status_guard(controller_user: str) -> Object:
    old_moves, new_moves = (_value(o, "defragmentation.inFlight", True) for o in ("oldObject", "object"))
    requested = "n.?phase.orValue('Requested') == 'Requested' && size(n.?evicted.orValue([])) == 0"
    tenant = "object.spec.?tenants.orValue([]).exists(t, t.namespace == {})"
    bounded = (f"n.node in object.?status.?selectedNodes.orValue([])"
               f" && n.pod.namespace == n.claim.namespace && {tenant.format('n.claim.namespace')}"
               f" && n.?evictions.orValue([]).all(v, {tenant.format('v.namespace')})"
               f" && timestamp(n.started) < timestamp(n.expires)"
               f" && timestamp(n.expires) - timestamp(n.started) <= duration('{MAX_REQUESTED_MOVE}s')")
    return {
        "apiVersion": ADMISSION_V1, "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": POLICY_STATUS, "labels": dict(MANAGED_BY)},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"matchPolicy": "Equivalent", "resourceRules": [
                {"apiGroups": [GROUP], "apiVersions": ["*"], "operations": ["UPDATE"],
                 "resources": ["gpuslicepolicies/status"]}]},
            "matchConditions": [{"name": "not-the-gpuslice-controller",
                                 "expression": f"request.userInfo.username != '{controller_user}'"}],
            "variables": [{"name": "changed", "expression": _changed()},
                          {"name": "oldMoves", "expression": old_moves},
                          {"name": "newMoves", "expression": new_moves}],
            "validations": [
                {"expression": "size(variables.changed) == 0",
                 "messageExpression": (
                     "'GpuSlicePolicy ' + object.metadata.name + ': only the gpuslice controller writes '"
                     " + variables.changed.join(', ') + ' (what tenancy, limits and defragmentation are judged"
                     " against); ' + request.userInfo.username + ' may only add or remove moves in"
                     f" {_MOVES} (gpuslice defrag --apply)'"),
                 "reason": "Forbidden"},
                {"expression": ("variables.newMoves.all(n, variables.oldMoves.exists(o, o == n)"
                                f" || (!variables.oldMoves.exists(o, o.id == n.id) && {requested}))"),
                 "messageExpression": (
                     "'GpuSlicePolicy ' + object.metadata.name + ': ' + request.userInfo.username + ' may add a"
                     f" move to {_MOVES} only as a request (phase Requested, nothing evicted), and may not change"
                     " a move already recorded (only remove it): the gpuslice controller carries moves out'"),
                 "reason": "Forbidden"},
                {"expression": (f"variables.newMoves.all(n, variables.oldMoves.exists(o, o == n) || ({bounded}))"),
                 "messageExpression": (
                     "'GpuSlicePolicy ' + object.metadata.name + ': a move requested by ' + request.userInfo.username"
                     " + ' must name a GPU on a node of status.selectedNodes, a claim and pod of one tenant namespace"
                     " of spec.tenants, evictions in tenant namespaces only, and expire after it starts, within"
                     f" {MAX_REQUESTED_MOVE // 60} minutes (gpuslice defrag --timeout)'"),
                 "reason": "Invalid"},
            ],
        },
    }
