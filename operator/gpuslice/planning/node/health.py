"""GPU health, as the node agent publishes it: faults in, per-GPU state and device taints out (pure).

A GPU turns unhealthy at its first fault and healthy again only once it has gone
``recovery`` seconds without one, so a flapping GPU does not churn the slices (and
the scheduler's view) with every event. A lost GPU (fell off the bus, NVML says
"GPU is lost") is worse than an unhealthy one: its devices are tainted ``NoExecute``,
so the device-taint-eviction controller evicts the pods that use them; otherwise
``NoSchedule`` keeps new claims off while running pods stay. The taint is a status
of the device, not a change of it: the safety layer that holds back changes of
allocated devices never holds it back (``pool_safety`` compares devices without it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from gpuslice.dra.names import UNHEALTHY_TAINT_KEY

__all__ = ["UNHEALTHY_TAINT_KEY"]
FaultKind = Literal["xid", "ecc", "lost"]
Status = Literal["healthy", "unhealthy", "lost"]
_RANK: dict[Status, int] = {"healthy": 0, "unhealthy": 1, "lost": 2}


@dataclass(frozen=True)
class Fault:
    """Something wrong with a GPU, as its backend saw it. ``lost``: the GPU is gone (fell off the bus,
    needs a reset); work on it cannot continue."""

    kind: FaultKind
    code: int | None = None
    message: str = ""

    @property
    def reason(self) -> str:
        """A short form that fits a taint value: ``XID-79``, ``ECC``, ``GPU-lost``."""
        return {"xid": f"XID-{self.code}" if self.code is not None else "XID", "ecc": "ECC",
                "lost": "GPU-lost"}[self.kind]

    @property
    def status(self) -> Status:
        return "lost" if self.kind == "lost" else "unhealthy"

    def describe(self) -> str:
        what = {"xid": f"XID {self.code} error" if self.code is not None else "XID error",
                "ecc": "double-bit ECC error", "lost": "GPU lost (fell off the bus or needs a reset)"}[self.kind]
        return f"{what}: {self.message}" if self.message else what


@dataclass(frozen=True)
class GpuHealth:
    status: Status
    reason: str = ""  # the worst fault's short form while unhealthy
    message: str = ""
    since: float = 0.0  # when the current status began (monotonic seconds)
    last_fault: float = 0.0

    @property
    def healthy(self) -> bool:
        return self.status == "healthy"


HEALTHY = GpuHealth("healthy")


def step(previous: Mapping[str, GpuHealth], faults: Mapping[str, Fault], now: float,
         recovery: float) -> dict[str, GpuHealth]:
    """The GPUs' health after observing ``faults`` (by GPU UUID) at ``now``. Only GPUs that are not
    healthy appear in the result."""
    result: dict[str, GpuHealth] = {}
    for uuid in set(previous) | set(faults):
        old = previous.get(uuid, HEALTHY)
        fault = faults.get(uuid)
        if fault is not None:
            worse = _RANK[fault.status] >= _RANK[old.status]
            if old.healthy:
                result[uuid] = GpuHealth(fault.status, fault.reason, fault.describe(), now, now)
            elif worse:
                since = old.since if fault.status == old.status else now
                result[uuid] = GpuHealth(fault.status, fault.reason, fault.describe(), since, now)
            else:  # a lesser fault on a lost GPU keeps it lost, and keeps it from recovering
                result[uuid] = replace(old, last_fault=now)
        elif not old.healthy and now - old.last_fault < recovery:
            result[uuid] = old
    return result


def taint(health: GpuHealth) -> dict[str, Any] | None:
    """The taint of an unhealthy GPU's devices; None while it is healthy."""
    if health.healthy:
        return None
    return {"key": UNHEALTHY_TAINT_KEY, "value": health.reason,
            "effect": "NoExecute" if health.status == "lost" else "NoSchedule"}
