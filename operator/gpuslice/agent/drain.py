"""Drain without a timer: a device goes only once the API server refuses to let any claim have it.

The scheduler chooses devices from what it has seen and writes the claim's allocation later
(at PreBind). A device the agent is about to change or remove may have been chosen already,
and the write that says so can land any time later: a congested uplink, client-side rate
limiting, a stalled apiserver or etcd. No wait on the agent's clock is long enough. So the
agent does not wait; it makes such a write impossible first:

1. The device is published tainted (``gpuslice.dev/pending-change:NoSchedule``, so nothing new
   chooses it) and listed in the node's own drain object, ConfigMap ``<namespace>/gpuslice-draining-<node>``
   (gpuslice's own namespace: the ``namespace`` setting), labelled ``gpuslice.dev/drain-list``.
2. The ValidatingAdmissionPolicy ``gpuslice-drain`` (manifests/agent-rbac.yaml), whose binding
   selects every drain object as a parameter, refuses any write to a claim's status that
   allocates a listed device. The scheduler's late write is refused; it schedules the pod again.
3. The agent proves the rule is in force for the device: it dry-runs the create of a probe
   ConfigMap ``<namespace>/gpuslice-drain-probe`` naming the device, which the same rule
   judges with the same parameters and check, and the API server refuses it (an apiserver loads
   a changed parameter a moment after it is written).
4. Only then are the claims read: a claim that got the device before step 3 is seen (it is held,
   not removed); any later attempt is refused. A free device changes or goes.

One object per node, and each agent may write only its own (``gpuslice-agent-own-drain-entry``):
no node's list can crowd out another's, whatever a stolen agent token writes. A node with
nothing to drain has no object; with none at all the rule has no parameter and refuses nothing.

A removed device stays listed for ``RETENTION`` (or until it is published again), for writes
still on their way. Left open: a scheduler write delayed longer than that, and the moment in one
apiserver between a request passing admission and its commit to etcd. With several
apiservers, each loads the parameters on its own; the probe proves it for the one that answered.
The second line for all of these is the kubelet plugin, which refuses to prepare a device that
is no longer published as allocated.

While listed devices wait (the rule not yet in force, the write or the probe refused), the
cycle that asks again comes after a jittered backoff, 0.5 s doubling to the resync: every such
cycle reads every claim in the cluster, so a drain that cannot progress must not read them more
often than the resync does.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import structlog

from gpuslice.backoff import Backoff
from gpuslice.coordinates import configmap_path, configmaps_in
from gpuslice.dra.names import CONTROLLER_NAMESPACE, DRAIN_LIST_LABEL, DRAIN_OBJECT_PREFIX
from gpuslice.kube.client import KubeClient, KubeError, NotFound

DRAINING = DRAIN_OBJECT_PREFIX  # + node: ConfigMap, data {node: space-separated device names}
LABEL = DRAIN_LIST_LABEL  # the gpuslice-drain binding selects its parameters by this label
PROBE = "gpuslice-drain-probe"  # ConfigMap whose create the agents dry-run
MARKER = "gpuslice-drain: "  # how the admission rule's message begins, then "pool/device ..."
RETENTION = 600.0  # seconds a removed device stays listed
RECHECK = 0.5  # seconds before a cycle asks again about newly listed devices (then doubling)
MAX_RECHECK = 60.0  # the most between such cycles (the agent passes its resync)
# The API server drops a rule's messageExpression longer than 5 KiB for its static message, which
# names no device (k8s.io/apiserver, celconfig.MaxEvaluatedMessageExpressionSizeBytes): a probe
# asks about as many devices as the refusal can name, with room for the words around them.
PROBE_BYTES = 4 * 1024
log = structlog.get_logger(__name__)


def drain_object(node: str) -> str:
    """The name of ``node``'s own drain object."""
    return DRAINING + node


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
    return f"gpuslice-agent-{node}"[:128]


def drain_body(node: str, names: set[str], home: str = CONTROLLER_NAMESPACE) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": drain_object(node), "namespace": home, "labels": {LABEL: "true"}},
            "data": {node: " ".join(sorted(names))}}


@dataclass
class Drains:
    """This node's drain object, and when listed devices went (this process only: a restarted
    agent keeps what it finds listed for another ``RETENTION``)."""

    listed: set[str] = field(default_factory=set)
    removed: dict[str, float] = field(default_factory=dict)
    waiting: bool = False  # listed devices not yet refused by the API server
    warned: bool = False
    recheck: Backoff = field(default_factory=lambda: Backoff(RECHECK, MAX_RECHECK))
    progressed: bool = False  # since the last due_in: devices newly listed, or newly refused
    refused_before: set[str] = field(default_factory=set)  # what the last probe showed refused
    home: str = CONTROLLER_NAMESPACE  # gpuslice's own namespace (the `namespace` setting)
    loaded: bool = False  # read once: this agent is its only writer

    async def load(self, kube: KubeClient, node: str, now: float | None = None) -> None:
        """Read this node's entry: at the first cycle (a restarted agent finds its own), and again
        while listed devices wait to be refused (someone may have edited or deleted it). Between,
        this agent is its only writer and keeps it in memory: a cycle with nothing draining reads
        nothing."""
        if self.loaded and not self.waiting:
            return
        now = time.monotonic() if now is None else now
        try:
            body = await kube.get(configmap_path(self.home, drain_object(node)))
        except NotFound:
            body = {}  # nothing listed: the object is made when a device first drains
        found = set(((body.get("data") or {}).get(node) or "").split())
        for name in found - self.listed:
            self.removed.setdefault(name, now)  # until shown otherwise, a device that may have gone
        self.listed = found
        self.loaded = True

    async def refused(self, kube: KubeClient, node: str, candidates: set[str]) -> set[str]:
        """The candidates no claim can be allocated any more: the probe's dry run is refused for them."""
        confirmed: set[str] = set()
        for asked in probe_batches(node, sorted(candidates & self.listed)):
            probe = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": PROBE, "namespace": self.home},
                     "data": {"pool": node, "devices": " ".join(asked)}}
            try:
                await kube.create(configmaps_in(self.home), probe, idempotent=True, dryRun="All")
            except KubeError as error:
                if MARKER in error.message:
                    said = error.message.split(MARKER, 1)[1].split(" are ", 1)[0].split()
                    confirmed |= {ref.split("/", 1)[1] for ref in said if ref.startswith(f"{node}/")} & set(asked)
                elif error.transient:
                    raise
                else:
                    self._warn(f"the drain probe failed: {error}")
                    break
        waiting = (candidates & self.listed) - confirmed  # held devices (tainted, unlisted) wait on claims
        self.progressed |= bool(confirmed - self.refused_before)  # a device refused again is no news
        self.refused_before = confirmed
        self.waiting = bool(waiting)
        if waiting and self.recheck.current >= self.recheck.limit:
            self._warn(f"{len(waiting)} listed devices are still not refused to claims by the API server"
                       " (is ValidatingAdmissionPolicyBinding gpuslice-drain installed?)")
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
        """This node's drain object as ``names``; with none, no object (the rule then has nothing of
        this node's to read)."""
        if names == self.listed:
            return
        path = configmap_path(self.home, drain_object(node))
        try:
            if names:
                await kube.apply(path, drain_body(node, names, self.home), field_manager=field_manager(node))
            else:
                with contextlib.suppress(NotFound):
                    await kube.delete(path)
        except KubeError as error:
            if error.transient:
                raise
            self._warn(f"the drain list could not be written: {error}")
            return
        self.progressed |= bool(names - self.listed)
        self.listed = set(names)

    def due_in(self) -> float | None:
        """Seconds until the next cycle should ask again; None when nothing waits. Soon after
        progress; otherwise each wait doubles (jittered) up to the resync."""
        if not self.waiting:
            self.recheck.reset()
            return None
        if self.progressed:
            self.recheck.reset()
            self.progressed = False
        return self.recheck.next()

    def _warn(self, what: str) -> None:
        if not self.warned:
            log.error(f"{what}: devices that are to change stay published, tainted, and never change."
                      " Apply manifests/agent-rbac.yaml (it ships the agents' RBAC, the drain rule and its"
                      " binding, and the rule that lets each agent write only its own drain object).")
            self.warned = True
