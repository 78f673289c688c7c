"""Which policies' status may have changed since it was last refreshed.

The status timer used to rebuild every policy's status from every slice, claim and node
every 10 s: work that grows with the fleet times the policies, for a status that had not
changed. The watch handlers now note what each event can affect, and the timer refreshes
a policy only when something did (or its last reconcile failed):

- a slice: the policies of the devices in it, and those its pool leaves out now or did before;
- a claim: the policies of the devices it holds or held (a released claim's event no longer
  names its devices, so the last ones seen are remembered);
- a node's labels (what the inventory reads), a node added or removed, a namespace's labels or
  phase, a DeviceClass of someone else's, or any policy created, changed or deleted (validation
  judges policies against each other): every policy.

Each is noted by an event handler, which Kopf runs on the event loop once its index holds the
new object. Noted from an index handler (a thread, before Kopf stores what it returns), a refresh
in between took the note and read the old object, and nothing noted it again.

The drift timer still reconciles every policy fully every 120 s, whatever changed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpuslice.planning.cluster.cluster_objects import DeviceRef
from gpuslice.planning.reads.usage import ClaimView, SliceView


@dataclass
class Changes:
    dirty: set[str] = field(default_factory=set)
    epoch: int = 0  # bumped when every policy may have changed
    refreshed: dict[str, int] = field(default_factory=dict)  # policy -> epoch of its last refresh
    device_policy: dict[DeviceRef, str] = field(default_factory=dict)
    claim_devices: dict[tuple[str, str], tuple[DeviceRef, ...]] = field(default_factory=dict)
    pool_left_out: dict[str, frozenset[str]] = field(default_factory=dict)  # pool -> policies it left out
    node_labels: dict[str, dict[str, str]] = field(default_factory=dict)
    shared: dict[str, object] = field(default_factory=dict)
    nodes_version: int = 0  # bumped by every change of a node's labels (what the inventory reads)
    devices_version: int = 0  # bumped by every event of one of our slices or of a claim

    def everything(self) -> None:
        self.epoch += 1

    def mark(self, policies: Iterable[str]) -> None:
        self.dirty.update(p for p in policies if p)

    def take(self, policy: str) -> bool:
        """Whether ``policy`` needs a refresh; it counts as refreshed from now on."""
        needed = policy in self.dirty or self.refreshed.get(policy) != self.epoch
        self.dirty.discard(policy)
        self.refreshed[policy] = self.epoch
        return needed

    def forget(self, policy: str) -> None:
        self.dirty.discard(policy)
        self.refreshed.pop(policy, None)

    def slice_seen(self, view: SliceView) -> set[str]:
        """Notes the slice; the policies whose status it may change (a policy no longer left out
        included: the slice that says so no longer names it)."""
        self.devices_version += 1
        for device, policy in view.devices:
            self.device_policy[DeviceRef(view.pool, device)] = policy
        left_out = frozenset(item.policy for item in view.left_out)
        touched = set(view.policies) | self.pool_left_out.get(view.pool, frozenset())
        if left_out:
            self.pool_left_out[view.pool] = left_out
        else:
            self.pool_left_out.pop(view.pool, None)
        self.mark(touched)
        return touched

    def claim_seen(self, key: tuple[str, str], view: ClaimView | None) -> None:
        self.devices_version += 1
        before = self.claim_devices.pop(key, ())
        now = view.devices if view is not None else ()
        if now:
            self.claim_devices[key] = now
        self.mark(self.device_policy.get(ref, "") for ref in (*before, *now))

    def node_seen(self, name: str, labels: Mapping[str, str] | None) -> None:
        """``labels`` None: the node is gone."""
        if labels is None:
            if self.node_labels.pop(name, None) is not None:
                self.nodes_version += 1
                self.everything()
        elif self.node_labels.get(name) != labels:
            self.node_labels[name] = dict(labels)
            self.nodes_version += 1
            self.everything()

    def shared_seen(self, key: str, view: object | None) -> None:
        """Something every policy's status may read (a namespace, a foreign DeviceClass) as
        ``view`` (comparable); None: it is gone."""
        if view is None:
            if self.shared.pop(key, None) is not None:
                self.everything()
        elif self.shared.get(key) != view:
            self.shared[key] = view
            self.everything()
