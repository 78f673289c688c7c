"""Drain without a timer: a device goes only once the API server refuses to let any claim have it.

The scheduler chooses devices from what it has seen and writes the claim's allocation later
(at PreBind). A device the agent is about to change or remove may have been chosen already,
and the write that says so can land any time later: a congested uplink, client-side rate
limiting, a stalled apiserver or etcd. No wait on the agent's clock is long enough. So the
agent does not wait; it makes such a write impossible first:

1. The device is published tainted (``gpuslice.dev/pending-change:NoSchedule``, so nothing new
   chooses it) and listed under the node's key in the ConfigMap
   ``gpuslice-system/gpuslice-draining``.
2. The ValidatingAdmissionPolicy ``gpuslice-drain`` (manifests/agent-rbac.yaml), with that
   ConfigMap as its parameter, refuses any write to a claim's status that allocates a listed
   device. The scheduler's late write is refused; it schedules the pod again.
3. The agent proves the rule is in force for the device: it dry-runs the create of a probe
   ConfigMap ``gpuslice-system/gpuslice-drain-probe`` naming the device, which the same rule
   judges with the same parameter and check, and the API server refuses it (an apiserver loads
   a changed parameter a moment after it is written).
4. Only then are the claims read: a claim that got the device before step 3 is seen (it is held,
   not removed); any later attempt is refused. A free device changes or goes.

A removed device stays listed for ``RETENTION`` (or until it is published again), for writes
still on their way. Left open: a scheduler write delayed longer than that, and the moment in one
apiserver between a request passing admission and its commit to etcd. With several
apiservers, each loads the parameter on its own; the probe proves it for the one that answered.
The second line for all of these is the kubelet plugin, which refuses to prepare a device that
is no longer published as allocated.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import structlog

from gpuslice.kube.client import KubeClient, KubeError, NotFound

NAMESPACE = "gpuslice-system"
DRAINING = "gpuslice-draining"  # ConfigMap: node -> space-separated device names
PROBE = "gpuslice-drain-probe"  # ConfigMap whose create the agents dry-run
MARKER = "gpuslice-drain: "  # how the admission rule's message begins, then "pool/device ..."
RETENTION = 600.0  # seconds a removed device stays listed
RECHECK = 0.5  # seconds between cycles while a listed device waits for the rule to be in force
# The API server drops a rule's messageExpression longer than 5 KiB for its static message, which
# names no device (k8s.io/apiserver, celconfig.MaxEvaluatedMessageExpressionSizeBytes): a probe
# asks about as many devices as the refusal can name, with room for the words around them.
PROBE_BYTES = 4 * 1024
CONFIGMAPS = f"/api/v1/namespaces/{NAMESPACE}/configmaps"
CONFIGMAP_PATH = f"{CONFIGMAPS}/{DRAINING}"
log = structlog.get_logger(__name__)


def probe_batches(node: str, names: list[str]) -> list[list[str]]:
    """``names`` in order, cut so that the refusal of each batch ("pool/device ...") fits PROBE_BYTES."""
    batches: list[list[str]] = []
    size = 0
    for name in names:
        ref = len(f"{node}/{name} ".encode())
        if not batches or size + ref > PROBE_BYTES:
            batches.append([])
            size = 0
        batches[-1].append(name)
        size += ref
    return batches


def field_manager(node: str) -> str:
    """One per node: server-side apply then gives each agent its own key of the shared ConfigMap."""
    return f"gpuslice-agent-{node}"[:128]


@dataclass
class Drains:
    """This node's entry in the drain list, and when listed devices went (this process only:
    a restarted agent keeps what it finds listed for another ``RETENTION``)."""

    listed: set[str] = field(default_factory=set)
    removed: dict[str, float] = field(default_factory=dict)
    waiting: bool = False  # listed devices not yet refused by the API server
    warned: bool = False

    async def load(self, kube: KubeClient, node: str, now: float | None = None) -> None:
        """Read this node's entry (an operator may have edited it; a restarted agent finds its own)."""
        now = time.monotonic() if now is None else now
        try:
            body = await kube.get(CONFIGMAP_PATH)
        except NotFound:
            self._warn("ConfigMap gpuslice-system/gpuslice-draining is missing")
            return
        found = set(((body.get("data") or {}).get(node) or "").split())
        for name in found - self.listed:
            self.removed.setdefault(name, now)  # until shown otherwise, a device that may have gone
        self.listed = found

    async def refused(self, kube: KubeClient, node: str, candidates: set[str]) -> set[str]:
        """The candidates no claim can be allocated any more: the probe's dry run is refused for them."""
        confirmed: set[str] = set()
        for asked in probe_batches(node, sorted(candidates & self.listed)):
            probe = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": PROBE, "namespace": NAMESPACE},
                     "data": {"pool": node, "devices": " ".join(asked)}}
            try:
                await kube.create(CONFIGMAPS, probe, idempotent=True, dryRun="All")
            except KubeError as error:
                if MARKER in error.message:
                    said = error.message.split(MARKER, 1)[1].split(" are ", 1)[0].split()
                    confirmed |= {ref.split("/", 1)[1] for ref in said if ref.startswith(f"{node}/")} & set(asked)
                elif error.transient:
                    raise
                else:
                    self._warn(f"the drain probe failed: {error}")
                    break
        self.waiting = bool((candidates & self.listed) - confirmed)  # held devices (tainted, unlisted) wait on claims
        return confirmed

    def wanted(self, draining: set[str], before: set[str], after: set[str], now: float | None = None) -> set[str]:
        """The entry after this cycle: what drains, and what went within ``RETENTION`` and is not back."""
        now = time.monotonic() if now is None else now
        for name in (before | self.listed) - after:
            self.removed.setdefault(name, now)
        self.removed = {n: t for n, t in self.removed.items() if n not in after and now - t < RETENTION}
        if draining - self.listed:
            self.waiting = True  # newly listed: the next cycle asks whether the rule holds them yet
        return draining | set(self.removed)

    async def write(self, kube: KubeClient, node: str, names: set[str]) -> None:
        if names == self.listed:
            return
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": DRAINING, "namespace": NAMESPACE},
                "data": {node: " ".join(sorted(names))}}
        try:
            await kube.apply(CONFIGMAP_PATH, body, field_manager=field_manager(node))
        except KubeError as error:
            if error.transient:
                raise
            self._warn(f"the drain list could not be written: {error}")
            return
        self.listed = set(names)

    def due_in(self) -> float | None:
        """Seconds until the next cycle should ask again; None when nothing waits."""
        return RECHECK if self.waiting else None

    def _warn(self, what: str) -> None:
        if not self.warned:
            log.error(f"{what}: devices that are to change stay published, tainted, and never change."
                      " Apply manifests/agent-rbac.yaml (it ships the ConfigMap, the probe claim and the rule).")
            self.warned = True
