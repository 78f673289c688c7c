"""What the node agent watches, and only that.

- Each policy's GpuSliceAgentView (``api.agent_view``), in gpuslice's namespace: what the planner
  reads of the policy, written by the controller, which changes only with the spec, the verdict
  or a move; never the policies themselves, whose status changes as pods are bound (a node may
  be selected by any policy, so every agent would have received every status write). A change
  wakes the agent only if it touches what the planner reads and the policy's node selector, old
  or new, matches this node; then once per burst, at a random moment within ``policy_jitter``
  seconds, so a fleet's cycles are spread over a second or two.
- Its own Node (``metadata.name``) and the ResourceSlices on it (``spec.nodeName``, an indexed
  field): the API server sends nothing about other nodes. A publish cycle reads them from here
  (``AgentView.slices``), not from the API server: the watch listed them, and the agent's own
  writes are kept as the API server answered them (a watch event older than that answer is
  not taken). Its own slices wake it when someone else changed them; other drivers' slices when
  the GPUs they name change (``planning.node.coexistence``).
- ResourceClaims only while the agent holds back a change for a claim (``want_claims``):
  claims cannot be selected by pool on the server, so a cluster-wide claim watch costs every
  agent every claim change in the cluster. While nothing waits for a claim, no claim event
  can change what the agent publishes; the publish cycle reads the claims itself, and only
  when its plan would remove or alter a published device.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from dataclasses import dataclass, field
from typing import Any

import pydantic
import structlog

from gpuslice.api.agent_view import policy_of, views_in
from gpuslice.api.policy import LabelSelector
from gpuslice.coordinates import CLAIMS, NODES, SLICES
from gpuslice.dra.names import CONTROLLER_NAMESPACE, DRIVER
from gpuslice.dra.wire import allocation_results
from gpuslice.kube.client import KubeClient
from gpuslice.kube.watch import watch
from gpuslice.planning.node.coexistence import OtherDriverGpus, other_driver_gpus

log = structlog.get_logger(__name__)
POLICY_JITTER = 2.0  # seconds: the spread of a fleet's wake-ups after a policy edit
# Seconds each watch stream runs before it is opened again (the API server ends it then): a fleet's
# only steady cost is these reconnections, three per agent each time (every 10 minutes by default, a
# third of a request a minute per node); a dead connection is still found within kube.watch.STALL.
WATCH_SECONDS = 3600


def planned_from(policy: dict[str, Any]) -> tuple[Any, ...]:
    """What the planner reads of a policy (``publisher.sort_policies``, ``planning.selection``):
    a change of anything else (status counts, annotations) wakes no agent."""
    meta, status = policy.get("metadata") or {}, policy.get("status") or {}
    valid: dict[str, Any] = next((c for c in status.get("conditions") or [] if c.get("type") == "Valid"), {})
    return (policy.get("spec"), meta.get("generation"), meta.get("creationTimestamp"), meta.get("deletionTimestamp"),
            status.get("observedGeneration"), valid.get("status"), valid.get("reason"),
            (status.get("defragmentation") or {}).get("inFlight"))  # GPUs being freed: their taint


def _version(body: dict[str, Any]) -> int | None:
    """An object's resourceVersion as a number (etcd's revision), or None when it is not one."""
    try:
        return int(str((body.get("metadata") or {}).get("resourceVersion")))
    except ValueError:
        return None


@dataclass
class AgentView:
    """The policies, the agent's Node and the slices on it as its watches last saw them."""

    policies: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Name -> (resourceVersion, the parsed policy or why it does not parse): parsing and judging a
    # policy is most of a cycle's CPU, and a policy changes far less often than cycles run.
    parsed: dict[str, tuple[str, Any]] = field(default_factory=dict)
    node: dict[str, Any] | None = None
    policies_listed: asyncio.Event = field(default_factory=asyncio.Event)
    node_listed: asyncio.Event = field(default_factory=asyncio.Event)
    # Every driver's slices on this node, by name; and, for those this agent wrote or deleted, the
    # least resourceVersion a watch event must have to be taken (one older than the agent's own
    # write, still on its way, would undo it here).
    slices: dict[str, dict[str, Any]] = field(default_factory=dict)
    slices_listed: asyncio.Event = field(default_factory=asyncio.Event)
    floors: dict[str, int] = field(default_factory=dict)

    @property
    def synced(self) -> bool:
        """Both watches have listed once: a policy not seen now is a policy that does not exist."""
        return self.policies_listed.is_set() and self.node_listed.is_set()

    def wrote(self, body: dict[str, Any]) -> None:
        """This agent wrote a slice: the API server's answer is what is there now."""
        name = str(body["metadata"]["name"])
        self.slices[name] = body
        version = _version(body)
        if version is not None:
            self.floors[name] = version

    def deleted(self, name: str) -> None:
        """This agent deleted a slice: no event from before stands for it any more."""
        gone = self.slices.pop(name, None)
        version = _version(gone) if gone is not None else None
        if version is not None:
            self.floors[name] = version + 1

    def echo(self, body: dict[str, Any]) -> bool:
        """Whether a slice event is this agent's own last write of it coming back."""
        version = _version(body)
        return version is not None and version == self.floors.get(str(body["metadata"]["name"]))

    def slice_seen(self, kind: str | None, body: dict[str, Any]) -> bool:
        """A slice event (kind None: listed); False when it is older than what the agent wrote."""
        name = str(body["metadata"]["name"])
        version, floor = _version(body), self.floors.get(name)
        if version is not None and floor is not None and version < floor:
            return False
        if kind == "DELETED":
            self.slices.pop(name, None)
        else:
            self.slices[name] = body
        return True


class AgentWatches:
    def __init__(self, kube: KubeClient, node: str, wake: asyncio.Event, stop: asyncio.Event,
                 policy_jitter: float = POLICY_JITTER, home: str = CONTROLLER_NAMESPACE) -> None:
        self.kube, self.node, self.wake, self.stop = kube, node, wake, stop
        self.views = views_in(home)  # the agent views, in gpuslice's namespace (the `namespace` setting)
        self.policy_jitter = policy_jitter
        self.view = AgentView()
        self._tasks: list[asyncio.Task[None]] = []
        self._claims: asyncio.Task[None] | None = None
        self._in_pool: set[tuple[str, str]] = set()
        self._listed_policies: set[str] = set()
        self._listed_slices: set[str] = set()
        self._policy_wake: asyncio.TimerHandle | None = None
        self._others: dict[str, OtherDriverGpus] = {}  # other drivers' slices on this node, by name

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._watch(self.views, self._view_event, self.view.policies_listed)),
            asyncio.create_task(self._watch(NODES, self._node_event, self.view.node_listed,
                                            fieldSelector=f"metadata.name={self.node}")),
            asyncio.create_task(self._watch(SLICES, self._slice_event, self.view.slices_listed,
                                            fieldSelector=f"spec.nodeName={self.node}")),
        ]

    async def close(self) -> None:
        if self._policy_wake is not None:
            self._policy_wake.cancel()
            self._policy_wake = None
        tasks = [*self._tasks, *([self._claims] if self._claims else [])]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks, self._claims = [], None

    def want_claims(self, wanted: bool) -> None:
        """Watch claims while a change waits for one to be released; stop when none does."""
        if wanted and self._claims is None:
            self._in_pool.clear()
            self._claims = asyncio.create_task(self._watch(CLAIMS, self._claim_event, None))
        elif not wanted and self._claims is not None:
            self._claims.cancel()
            self._claims = None

    @property
    def watching_claims(self) -> bool:
        return self._claims is not None

    async def _watch(self, path: str, handler: Any, listed: asyncio.Event | None, **query: str) -> None:
        def on_error(error: BaseException) -> None:
            log.warning("watch failed; will retry", node=self.node, path=path, error=str(error))

        def on_listed() -> None:
            if path == self.views:  # a policy deleted while the watch was down is not in the new list
                for name in set(self.view.policies) - self._listed_policies:
                    del self.view.policies[name]
                self._listed_policies = set()
            if path == SLICES:
                self._slices_relisted()
            if listed is not None:
                listed.set()
            # What changed while the watch was down (or, for claims, between the cycle's read and
            # this list) is looked at once.
            self.wake.set()

        await watch(self.kube, path, handler, self.stop, query=query, server_timeout=WATCH_SECONDS, on_error=on_error,
                    on_listed=on_listed)

    def _view_event(self, kind: str | None, view: dict[str, Any]) -> None:
        """A policy's agent view, as the policy the planner reads."""
        self._policy_event(kind, policy_of(view))

    def _policy_event(self, kind: str | None, body: dict[str, Any]) -> None:
        name = body["metadata"]["name"]
        old = self.view.policies.get(name)
        if kind == "DELETED":
            self.view.policies.pop(name, None)
        else:
            self.view.policies[name] = body
        if kind is None:
            self._listed_policies.add(name)
            return  # the (re)list: its end wakes the publisher
        if kind == "MODIFIED" and old is not None and planned_from(old) == planned_from(body):
            return  # e.g. the controller counting allocations in status: nothing the planner reads
        if not any(self._may_select(p) for p in (old, body) if p is not None):
            return  # neither the old nor the new spec selects this node: its pool does not change
        if self._policy_wake is None:  # a burst of edits is one wake-up, at one random moment
            self._policy_wake = asyncio.get_running_loop().call_later(
                random.uniform(0, self.policy_jitter), self._wake_for_policies)

    def _may_select(self, policy: dict[str, Any]) -> bool:
        """Whether the policy's node selector matches this node (True when that cannot be told)."""
        if self.view.node is None:
            return True
        labels = self.view.node["metadata"].get("labels") or {}
        try:
            selector = LabelSelector.model_validate((policy.get("spec") or {}).get("nodeSelector") or {})
        except pydantic.ValidationError:
            return True
        return selector.matches(dict(labels))

    def _wake_for_policies(self) -> None:
        self._policy_wake = None
        self.wake.set()

    def _slices_relisted(self) -> None:
        """As for policies: a slice gone while the watch was down is not in the new list."""
        for name in set(self.view.slices) - self._listed_slices:
            del self.view.slices[name]
        self._listed_slices = set()

    def _node_event(self, kind: str | None, body: dict[str, Any]) -> None:
        self.view.node = None if kind == "DELETED" else body
        if kind is not None:
            self.wake.set()

    def _slice_event(self, kind: str | None, body: dict[str, Any]) -> None:
        taken = self.view.slice_seen(kind, body)
        if kind is None:
            self._listed_slices.add(str(body["metadata"]["name"]))
            return
        if not taken or self.view.echo(body):
            return  # this agent's own write coming back, or older than it: nothing changed since
        if (body.get("spec") or {}).get("driver") == DRIVER:
            self.wake.set()  # someone changed or removed our slices: put them back
        else:
            # Another driver's slice on this node: the GPUs it names are left out of (or come back
            # to) this node's pool; anything else about it changes nothing here.
            name = str(body["metadata"]["name"])
            after = None if kind == "DELETED" else other_driver_gpus(body.get("spec") or {})
            if self._others.get(name) != after:
                self.wake.set()
            if after is None:
                self._others.pop(name, None)
            else:
                self._others[name] = after

    def _claim_event(self, kind: str | None, body: dict[str, Any]) -> None:
        key = (body["metadata"].get("namespace") or "", body["metadata"]["name"])
        ours = kind != "DELETED" and any(r["pool"] == self.node for r in allocation_results(body))
        if kind is not None and (ours or key in self._in_pool):
            self.wake.set()  # allocated from, or released back to, this pool
        if ours:
            self._in_pool.add(key)
        else:
            self._in_pool.discard(key)
