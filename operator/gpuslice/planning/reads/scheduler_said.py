"""What kube-scheduler last said of a pod it has not placed, and whether a free device would help (pure).

A claim is allocated only when the scheduler places its pod, so a GPU is worth freeing only for a
pod the scheduler turned away for devices. It runs its filters on each node in turn and stops at
the first that fails, DynamicResources last of them; the node's count under "cannot allocate all
claims" in the pod's ``PodScheduled`` condition is therefore of nodes that passed every other
filter (CPU, memory and pods left, ports, affinity, topology spread, volumes) and lacked only
devices. A pod with scheduling gates is not tried at all until its gates are removed (by whoever
set them, whenever they like), and one not yet tried has no verdict: neither is helped by freeing
a GPU now. The message counts nodes, it does not name them: a pod turned away for devices on one
node and for CPU on another may have a GPU freed on either (what the scheduler itself would say is
not re-implemented here).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuslice.jsontypes import Body

TURNED_AWAY = "cannot allocate all claims"  # DynamicResources' Filter verdict on a node
_FOR_DEVICES = re.compile(r"(?:^|[:,]) ?(\d+) " + re.escape(TURNED_AWAY))


@dataclass(frozen=True)
class SchedulerSaid:
    """The scheduler's word on a pod not on a node: its gates, and its PodScheduled condition."""

    gates: tuple[str, ...] = ()
    reason: str = ""  # the condition's reason when PodScheduled is False: Unschedulable, SchedulingGated, ...
    message: str = ""

    @classmethod
    def from_body(cls, body: Body) -> SchedulerSaid:
        spec, status = body.get("spec") or {}, body.get("status") or {}
        gates = tuple(str(g.get("name", "")) for g in spec.get("schedulingGates") or [])
        for condition in status.get("conditions") or []:
            if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
                return cls(gates, str(condition.get("reason") or ""), str(condition.get("message") or ""))
        return cls(gates)

    @property
    def nodes_short_of_devices(self) -> int:
        """How many nodes turned the pod away for devices alone (0 when the scheduler did not say so)."""
        if self.reason != "Unschedulable":
            return 0
        said = self.message.split(" preemption:", 1)[0]  # what follows is the preemption attempt's own count
        return sum(int(count) for count in _FOR_DEVICES.findall(said))

    def not_for_devices(self) -> tuple[str, str] | None:
        """(code, why) when freeing a device would not get the pod placed: it is gated, not yet tried,
        or turned away on every node for something else; None when some node lacked only devices."""
        if self.gates or self.reason == "SchedulingGated":
            return "Gated", (f"it carries scheduling gates ({', '.join(self.gates) or 'SchedulingGated'}): the"
                             " scheduler does not try it until they are removed")
        if self.nodes_short_of_devices:
            return None
        if self.reason != "Unschedulable":
            return "NotTried", "kube-scheduler has not turned it away yet: it may yet place it"
        return "NotDevices", (f"kube-scheduler turned it away for something a free device does not change"
                              f" ({self.message[:300]})")
