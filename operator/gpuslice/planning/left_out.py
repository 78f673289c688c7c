"""GPUs a policy's devices leave out for a state of the GPU only the node agent sees, told to the
controller (pure).

The controller judges a policy by node labels and slices; a GPU's MIG mode is in neither, nor is a
device plugin's claim on the node's GPUs (its Node's allocatable, which the agent reads). So the
agent writes what its plan left out, and why, on its pool's ResourceSlices (the annotation
``gpuslice.dev/left-out``, on every slice of a generation, an empty slice when the pool has no
device), and the controller turns it into the policy's ``Degraded`` condition. The reasons form a
closed set and the controller words the message itself: what one agent writes names only a GPU
index, a product and a reason, on its own node.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpuslice.dra.names import ATTRIBUTE_DOMAIN

ANNOTATION = f"{ATTRIBUTE_DOMAIN}/left-out"
# A MIG policy on a GPU below Hopper whose MIG mode is off: it switches only at a GPU reset.
MIG_MODE_OFF = "MigModeOff"
# A whole-GPU, memory or shared policy on a GPU whose MIG mode is on: no container could use it.
# Hopper and later: the agent switches it off by itself (a transition under way).
MIG_MODE_ON = "MigModeOn"
# The same before Hopper: it switches only at a GPU reset, which needs a step on the node.
MIG_MODE_ON_RESET = "MigModeOnNeedsReset"
# The same where the GPU Operator's MIG manager runs: its nvidia.com/mig.config has the final say.
MIG_MODE_ON_OPERATOR = "MigModeOnByMigManager"
# A device plugin advertises NVIDIA resources on the node: it could give the GPU to a pod too.
DEVICE_PLUGIN = "DevicePlugin"
REASONS = frozenset({MIG_MODE_OFF, MIG_MODE_ON, MIG_MODE_ON_RESET, MIG_MODE_ON_OPERATOR, DEVICE_PLUGIN})
MAX_PRODUCT = 64


@dataclass(frozen=True, order=True)
class LeftOut:
    """``policy``'s devices are not on GPU ``index`` (``product``) of the node, for ``reason``."""

    policy: str
    reason: str
    index: int
    product: str


def encode(left_out: Iterable[LeftOut]) -> str:
    """The annotation's value: ``{policy: [[reason, index, product], ...]}``, sorted, compact."""
    by_policy: dict[str, list[list[object]]] = {}
    for item in sorted(set(left_out)):
        by_policy.setdefault(item.policy, []).append([item.reason, item.index, item.product[:MAX_PRODUCT]])
    return json.dumps(by_policy, sort_keys=True, separators=(",", ":"))


def decode(annotations: Mapping[str, str] | None) -> tuple[LeftOut, ...]:
    """What a slice's annotations say was left out; anything malformed or of an unknown reason is
    ignored (an agent of another version, or a hand edit)."""
    text = (annotations or {}).get(ANNOTATION)
    if not text:
        return ()
    try:
        data = json.loads(text)
    except ValueError:
        return ()
    found = []
    for policy, items in (data.items() if isinstance(data, dict) else ()):
        for item in items if isinstance(items, list) else ():
            if (isinstance(item, list) and len(item) == 3 and item[0] in REASONS and isinstance(item[1], int)
                    and isinstance(item[2], str)):
                found.append(LeftOut(str(policy), item[0], item[1], item[2][:MAX_PRODUCT]))
    return tuple(sorted(found))


def left_out_annotations(left_out: Sequence[LeftOut]) -> dict[str, str]:
    return {ANNOTATION: encode(left_out)} if left_out else {}
