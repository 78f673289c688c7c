"""The GpuSliceLedger API: what a tenant with ``maxMemory`` holds, charge by charge.

One ledger per policy and tenant namespace, in gpuslice's namespace (out of tenants' reach; the
node agents may not read it). The controller writes its ``spec`` (the limit in force, as it
writes a ResourceQuota's ``spec.hard``); the maxMemory webhook writes its ``status`` (the charges,
as kube-controller-manager and the quota admission write a quota's ``status.used``), each
allocation charged with an optimistic-concurrency write before the allocation is admitted.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from gpuslice import coordinates
from gpuslice.api.rules import ApiModel
from gpuslice.coordinates import LEDGER_PLURAL as LEDGER_PLURAL

LEDGER_KIND = "GpuSliceLedger"
# The most allocations one tenant may hold at once under a ledger: every charge is rewritten with
# each admission, and an object holds at most ~1.5 MB in etcd.
MAX_CHARGES = 4096


def ledger_name(policy: str, namespace: str) -> str:
    """``<policy>.<namespace>``: both are DNS labels, so the name is unique and readable."""
    return f"{policy}.{namespace}"


def ledgers(home: str) -> str:
    """The ledgers' collection in ``home``, gpuslice's own namespace (the processes' `namespace` setting)."""
    return coordinates.ledgers_in(home)


def ledger_path(policy: str, namespace: str, home: str) -> str:
    return coordinates.ledger_path(home, ledger_name(policy, namespace))


def ledger_status_path(policy: str, namespace: str, home: str) -> str:
    return coordinates.ledger_status_path(home, ledger_name(policy, namespace))


class LedgerSpec(ApiModel):
    """Written by the controller when it converges a valid spec: the limit in force."""

    policy: str = Field(max_length=63, description="The GpuSlicePolicy.")
    namespace: str = Field(max_length=63, description="The tenant namespace.")
    namespace_uid: str = Field(max_length=64, description=(
        "The namespace's UID: a namespace deleted and made again gets a new ledger, counted afresh."))
    max_memory: str = Field(max_length=32, description="spec.tenants[].maxMemory as converged.")
    limit_bytes: int = Field(ge=0, description="The same in bytes: what the webhook judges against.")


class Charge(ApiModel):
    """One claim's allocation, charged when the webhook admitted it."""

    claim: str = Field(max_length=253, description="The claim's name.")
    uid: str = Field(max_length=64, description="The claim's UID: a claim made again is another claim.")
    bytes: int = Field(ge=0, description="GPU memory the allocation holds of this policy's devices.")
    at: str = Field(max_length=32, description=(
        "When it was charged (RFC 3339). A charge whose claim holds no allocation this long after is"
        " a write that never happened, and is released."))


class LedgerStatus(ApiModel):
    """Written by the maxMemory webhook only."""

    since: str | None = Field(default=None, max_length=32, description=(
        "When the webhook counted what the namespace held from its claims (a quorum list) and began"
        " charging; the limit is in force only from then."))
    namespace_uid: str | None = Field(default=None, max_length=64, description=(
        "The namespace UID it counted for (spec.namespaceUID when it is current)."))
    held_bytes: int = Field(default=0, ge=0, description="The sum of the charges.")
    charges: list[Charge] = Field(default_factory=list, max_length=MAX_CHARGES, description=(
        "One per claim that holds, or was just admitted to hold, this policy's devices."))

    @property
    def held(self) -> int:
        return sum(c.bytes for c in self.charges)


class GpuSliceLedger(ApiModel):
    """A ledger as read from the API server."""

    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: LedgerSpec
    status: LedgerStatus = Field(default_factory=LedgerStatus)

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> GpuSliceLedger:
        return cls.model_validate({"metadata": body.get("metadata") or {}, "spec": body.get("spec") or {},
                                   "status": body.get("status") or {}})

    @property
    def name(self) -> str:
        return str(self.metadata.get("name", ""))

    @property
    def resource_version(self) -> str:
        return str(self.metadata.get("resourceVersion", ""))

    @property
    def in_force(self) -> bool:
        """Counted for the namespace its spec names now: the webhook charges against it."""
        return self.status.since is not None and self.status.namespace_uid == self.spec.namespace_uid
