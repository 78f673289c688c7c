"""A node agent's mark that a claim's pods use more GPU memory than it was allocated, as it goes
from the agent to the controller (pure).

The agent measures; the controller acts. The mark travels on the claim: a condition
``GpuMemoryOveruse`` on each device of it on the GPU where its pods (every pod that shares it)
use more than it holds (``status.devices``, KEP-4817), whose ``data`` names those pods and, of
them, the ones ``onOveruse: Evict`` evicts (``evict``: the largest users, until the rest fit;
``planning.node.gpu_use.to_evict``). A mark that says nothing of ``evict`` (an agent from before
claims were judged whole, when every pod named was over on its own) gets every pod it names evicted.

From Kubernetes 1.36 the API server lets a driver's node-bound identity write ``status.devices``
only of claims allocated on its own node
(``associated-node:patch`` on ``resourceclaims/driver``; k8s.io/kubernetes v1.37.2
``pkg/registry/resource/utils.go``, ``AuthorizedForDeviceStatus``, which takes the node from the
allocation's node selector as :func:`allocation_node` does). So an agent, or its stolen token, marks
only its own node's claims, and needs no right to evict pods or to post Events about them.

The controller, which watches claims, posts the Events and evicts (``onOveruse: Evict``), and only
pods it checks itself (:func:`overusing_pods`): those the claim is reserved for, by UID, on the node
the claim is allocated on, named in a mark on one of the claim's own devices in that node's pool.
A rogue node can therefore mark only its own node's claims and get only its own node's pods acted
on: pods that run on it, at its mercy anyway.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gpuslice.dra.names import DRIVER
from gpuslice.dra.wire import (
    DeviceStatus,
    allocation_node_selector,
    device_condition,
    device_statuses,
    reserved_for,
    share_id,
    status_results,
)

CONDITION = "GpuMemoryOveruse"
OVER, WITHIN = "OverAllocation", "WithinAllocation"  # the condition's reasons
PODS = "overusingPods"  # the key of the device entry's data that names them
MAX_PODS = 16  # named per device, as many of these as fit in the entry's data (at most 10 KiB)
MAX_DATA = 10 * 1024
MAX_MESSAGE = 512


@dataclass(frozen=True, order=True)
class DeviceKey:
    """One allocated device of a claim, as ``status.devices`` keys it (for our driver)."""

    pool: str
    device: str
    share_id: str = ""


@dataclass(frozen=True)
class Overuser:
    """A pod of a claim over its allocation on a device's GPU, as the agent names it in the mark."""

    uid: str
    name: str
    since: str  # when the agent reported it (RFC 3339): one overuse, for the controller's Events
    message: str
    evict: bool = True  # one that onOveruse: Evict evicts (the claim's largest users, until the rest fit)


@dataclass(frozen=True)
class Mark:
    """What the agent says of one device of a claim: who is over (none: the condition is False)."""

    overusers: tuple[Overuser, ...]
    message: str
    since: str  # the condition's lastTransitionTime
    said: bool | None = None  # the condition's status, when read from a claim (None: whether it names pods)

    @property
    def over(self) -> bool:
        return self.said if self.said is not None else bool(self.overusers)

    def same(self, other: Mark | None) -> bool:
        """Whether writing this over ``other`` would change what it says (not merely its wording)."""
        return (other is not None and self.over == other.over
                and {(o.uid, o.evict) for o in self.overusers} == {(o.uid, o.evict) for o in other.overusers})


def device_entry(key: DeviceKey, mark: Mark) -> dict[str, Any]:
    """The ``status.devices`` entry that carries the mark."""
    pods: list[dict[str, str | bool]] = []
    for o in sorted(mark.overusers, key=lambda o: not o.evict)[:MAX_PODS]:  # those to evict first: all named
        pod: dict[str, str | bool] = {"uid": o.uid, "name": o.name, "since": o.since,
                                      "message": o.message[:MAX_MESSAGE], "evict": o.evict}
        if len(json.dumps({PODS: [*pods, pod]})) > MAX_DATA:
            break  # the rest are named once these are gone
        pods.append(pod)
    entry: dict[str, Any] = {
        "driver": DRIVER, "pool": key.pool, "device": key.device,
        "conditions": [{"type": CONDITION, "status": "True" if mark.over else "False",
                        "reason": OVER if mark.over else WITHIN, "message": mark.message[:32768],
                        "lastTransitionTime": mark.since}],
        "data": {PODS: pods},
    }
    if key.share_id:
        entry["shareID"] = key.share_id
    return entry


def _overusers(entry: DeviceStatus) -> tuple[Overuser, ...]:
    data = entry.get("data")
    pods = data.get(PODS) if isinstance(data, Mapping) else None
    found = []
    for pod in pods if isinstance(pods, list) else []:
        if isinstance(pod, Mapping) and isinstance(pod.get("uid"), str) and pod["uid"]:
            found.append(Overuser(pod["uid"], str(pod.get("name") or ""), str(pod.get("since") or ""),
                                  str(pod.get("message") or ""), pod.get("evict") is not False))
    return tuple(found[:MAX_PODS])


def read_marks(status: Mapping[str, Any], pool: str) -> dict[DeviceKey, Mark]:
    """The marks on a claim's devices of ``pool`` (what a restarted agent of that node starts from)."""
    marks = {}
    for entry in device_statuses(status):
        condition = device_condition(entry, CONDITION)
        if entry["pool"] != pool or condition is None:
            continue
        over = condition.get("status") == "True"
        key = DeviceKey(pool, entry["device"], share_id(entry))
        marks[key] = Mark(_overusers(entry) if over else (), str(condition.get("message") or ""),
                          str(condition.get("lastTransitionTime") or ""), over)
    return marks


def allocation_node(status: Mapping[str, Any]) -> str:
    """The node a claim is allocated on, read as the API server reads it to authorise a node-bound
    identity's write of ``status.devices`` (``nodeNameFromAllocation``): a selector of exactly one
    term with exactly one field, ``metadata.name In [node]``; else '' (no node's agent may write)."""
    selector = allocation_node_selector(status)
    terms = selector.get("nodeSelectorTerms") or []
    if len(terms) != 1 or terms[0].get("matchExpressions") or len(terms[0].get("matchFields") or []) != 1:
        return ""
    field = terms[0]["matchFields"][0]
    values = field.get("values") or []
    if field.get("key") != "metadata.name" or field.get("operator") != "In" or len(values) != 1:
        return ""
    return str(values[0])


def reserved_pods(status: Mapping[str, Any]) -> dict[str, str]:
    """Pod UID -> pod name, for the pods the claim is reserved for (written by the scheduler)."""
    return {r["uid"]: r["name"] for r in reserved_for(status) if r["resource"] == "pods" and not r["apiGroup"]
            and r["uid"]}


def _allocated(status: Mapping[str, Any]) -> set[DeviceKey]:
    return {DeviceKey(r["pool"], r["device"], share_id(r)) for r in status_results(status)}


@dataclass(frozen=True)
class OverusingPod:
    """A pod the controller may act on: named by a mark the claim's node could write, reserving the claim."""

    namespace: str
    name: str  # the claim's own record of it (reservedFor), not the mark's
    uid: str
    node: str
    claim: str
    device: str
    since: str
    message: str
    evict: bool = True  # onOveruse: Evict evicts it (the mark chose it, on one of the claim's devices)

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


def overusing_pods(namespace: str, claim: str, status: Mapping[str, Any]) -> list[OverusingPod]:
    """The pods a claim's marks name that the controller may act on: marks on the claim's own
    allocated devices of our driver, in the pool of the node the claim is allocated on (the one
    node whose agent the API server lets write them; our pools are named after their nodes), naming
    pods the claim is reserved for. Anything else is ignored: it proves nothing. A pod chosen for
    eviction on any of the devices is chosen."""
    node = allocation_node(status)
    if not node:
        return []
    allocated, reserved = _allocated(status), reserved_pods(status)
    found: dict[str, OverusingPod] = {}
    for key, mark in sorted(read_marks(status, node).items()):
        if key not in allocated:
            continue
        for overuser in mark.overusers:
            if overuser.uid not in reserved:
                continue
            if overuser.uid not in found:
                found[overuser.uid] = OverusingPod(namespace, reserved[overuser.uid], overuser.uid, node, claim,
                                                   key.device, overuser.since, overuser.message or mark.message,
                                                   overuser.evict)
            elif overuser.evict and not found[overuser.uid].evict:
                found[overuser.uid] = replace(found[overuser.uid], evict=True)
    return list(found.values())


def summary(overusers: Sequence[Overuser]) -> str:
    """The condition's message: the first pod's words, and how many more there are."""
    if not overusers:
        return ""
    more = f" (and {len(overusers) - 1} more pods)" if len(overusers) > 1 else ""
    return overusers[0].message + more
