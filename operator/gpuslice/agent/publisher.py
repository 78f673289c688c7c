"""What the publish cycle (``agent.pool``) reads and reports: the policies it plans from, the
claims allocated from the pool, its result and its metrics.

Each cycle reads the claims allocated from the pool from the API server whenever the plan
would remove or alter a published device, rather than from a watch cache: a freshly
started agent can never mistake "not listed yet" for "not allocated". The policies (their
agent views), the Node and the slices on the node come from the agent's watches once they
have listed (``AgentView``), so a cycle with nothing to change makes no request: a stale one
can only make the agent plan a change, and every change is judged on claims read then.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pydantic
from prometheus_client import Counter, Gauge

from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.coordinates import CLAIMS
from gpuslice.dra.wire import allocation_results
from gpuslice.kube.client import KubeClient
from gpuslice.kube.watch import list_all

FIELD_MANAGER = "gpuslice-agent"
CYCLES = Counter("gpuslice_agent_publish_cycles", "Publish cycles, by outcome (unchanged, written, failed: tried"
                 " again with backoff).", ["outcome"])
DEVICES = Gauge("gpuslice_agent_devices", "Devices this agent publishes.")
HELD = Gauge("gpuslice_agent_held_devices", "Allocated devices kept as they were while a change waits.")
CLAIM_READS = Counter("gpuslice_agent_claim_reads", "Publish cycles that read every claim (outcome read: a published"
                      " device was to change) or did not need to (skipped).", ["outcome"])
REFUSED = Gauge("gpuslice_agent_refused_policies",
                "Policies left out on this node: the API server refused their devices.")


@dataclass(frozen=True)
class PublishResult:
    generation: int
    written: tuple[str, ...]
    deleted: tuple[str, ...]
    held: tuple[str, ...]
    notes: tuple[str, ...]
    draining: tuple[str, ...] = ()
    refused: tuple[str, ...] = ()  # policies left out: the API server refused their devices
    again: bool = False  # the MIG manager changed a GPU: publish again now

    @property
    def changed(self) -> bool:
        return bool(self.written or self.deleted)


async def allocated_devices(kube: KubeClient, node: str) -> set[str]:
    """Names of this pool's devices that some claim has allocated (every claim, in pages:
    the API server cannot select claims by pool). Not with admin access: that takes no device
    from anyone (the scheduler counts nothing taken), so it holds back no change of one."""
    found: set[str] = set()
    claims, _ = await list_all(kube, CLAIMS)
    for claim in claims:
        found.update(r["device"] for r in allocation_results(claim) if r["pool"] == node and not r.get("adminAccess"))
    return found


@dataclass(frozen=True)
class Policies:
    """The policies to plan from, and those whose published devices stay as they are (and why)."""

    plannable: list[GpuSlicePolicy]
    frozen: dict[str, str]


def _not_yet_valid(policy: GpuSlicePolicy) -> str | None:
    """Why the controller's verdict does not cover this spec; None when it is valid."""
    status = policy.status
    if status.observed_generation != policy.metadata.generation:
        return f"generation {policy.metadata.generation} is not validated by the controller yet"
    valid = next((c for c in status.conditions if c.type == "Valid"), None)
    if valid is None or valid.status != "True":
        return f"the controller found it invalid ({valid.reason if valid else 'no Valid condition'})"
    return None


def _parse(body: dict[str, Any]) -> GpuSlicePolicy | str:
    """The policy, or why it does not parse."""
    try:
        return GpuSlicePolicy.from_body(body)
    except pydantic.ValidationError as error:
        return f"it does not parse: {error.errors()[0]['msg'] if error.errors() else error}"


def sort_policies(bodies: Iterable[dict[str, Any]], unsupported: Mapping[str, str] | None = None,
                  parsed: dict[str, tuple[str, Any]] | None = None) -> Policies:
    """``unsupported``: slicing mode -> why this API server cannot serve it; such policies keep what
    they published (nothing, on a new node) rather than publish devices the server would mangle.
    ``parsed``: the agent's policies parsed at their resourceVersion, reused while it is the same
    (the models are frozen) and kept to the policies there are."""
    plannable, frozen = [], {}
    seen = set()
    for body in bodies:
        name, version = body["metadata"]["name"], body["metadata"].get("resourceVersion")
        seen.add(name)
        if body["metadata"].get("deletionTimestamp"):
            continue  # going away: its free devices go, allocated ones wait for their claims
        hit = parsed.get(name) if parsed is not None and version else None
        policy = hit[1] if hit is not None and hit[0] == version else _parse(body)
        if parsed is not None and version:
            parsed[name] = (version, policy)
        if isinstance(policy, str):
            frozen[name] = policy
            continue
        reason = (unsupported or {}).get(policy.spec.slicing.mode) or _not_yet_valid(policy)
        if reason is None:
            plannable.append(policy)
        else:
            frozen[name] = reason
    if parsed is not None:
        for name in set(parsed) - seen:
            del parsed[name]
    return Policies(plannable, frozen)
