"""The tenancy rule's clause for GPUs being freed (defragmentation): the freed GPU goes to the pod
it is freed for, and to no other claim.

A GPU being freed is recorded in its policy's ``status.defragmentation.inFlight`` (requested by
``gpuslice defrag --apply``, or recorded by the controller, before anything is evicted). A move
counts once the controller has judged it (any phase but ``Requested``: gpuslice-policy-status lets
no one else write past it), so whoever may request moves reserves no GPU by it. The rule takes every
GpuSlicePolicy as its parameter already. So, judged against each policy, the scheduler's write of an
allocation is refused when it gives a claim any device of a GPU that policy records as being freed,
unless the claim is the waiting one: by UID, or a claim its pod owns (the claim the scheduler makes
for a pod's extended resources). Every device of a GPU is named with the GPU's tag and a dash
first (``gpu-2d3e5f1a-...``: planning.devices), which is how the rule knows them without a list.

Why a rule and not a toleration: a claim's spec cannot change once made, and tenants may tolerate
no ``gpuslice.dev/`` taint (the rule refuses that), so the waiting claim can be given no way
through a taint. The node agent taints the GPU's other devices instead (``gpuslice.dev/defrag``),
which keeps the scheduler from even trying them for the moved pods' replacements, and leaves the
one device the waiting claim asks for untainted; this clause keeps every other claim off that one
(and off the rest, for a decision the scheduler made before the taint reached it). No clock is
read by the rule (CEL in admission has none): the record is removed when the move ends, fails or
expires, by whoever carries it out or by the controller.
"""

from __future__ import annotations

from gpuslice.dra.names import DRIVER

_MOVES = ("(has(params.status) && has(params.status.defragmentation)"
          " && has(params.status.defragmentation.inFlight) ? params.status.defragmentation.inFlight : [])"
          ".filter(m, m.?phase.orValue('Requested') != 'Requested')")
_RESULTS = ("has(object.status.allocation.devices) && has(object.status.allocation.devices.results)"
            " ? object.status.allocation.devices.results : []")
_WAITING = ("(request.namespace == m.claim.namespace && (object.metadata.uid == m.claim.uid"
            " || (has(object.metadata.ownerReferences) && object.metadata.ownerReferences.exists(o,"
            " o.kind == 'Pod' && o.uid == m.pod.uid))))")


def variables() -> list[tuple[str, str]]:
    """``freeing``: the moves of the parameter policy whose GPU this allocation takes a device of,
    for a claim that is not the one the GPU is freed for (needs the rule's ``allocating``)."""
    return [
        ("freeing", f"variables.allocating ? ({_MOVES}).filter(m, !{_WAITING} && ({_RESULTS}).exists(x,"
                    f" x.driver == '{DRIVER}' && x.pool == m.node && x.device.startsWith(m.gpuTag + '-'))) : []"),
    ]


def validation() -> tuple[str, str]:
    return (
        "size(variables.freeing) == 0",
        "variables.who + ': GPU ' + variables.freeing[0].gpuTag + ' of node ' + variables.freeing[0].node"
        " + ' is being freed by gpuslice for pod ' + variables.freeing[0].pod.namespace + '/'"
        " + variables.freeing[0].pod.name + ' (defragmentation, until ' + variables.freeing[0].expires + '):"
        " only the claim of that pod may be allocated its devices until then; the scheduler will find this claim"
        " another place'",
    )
