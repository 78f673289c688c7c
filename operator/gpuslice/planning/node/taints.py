"""Taints the node agent puts on its own devices to say what state a GPU is in (pure).

They are statuses, not part of what a device is: the safety layer compares devices
without them (a GPU turning unhealthy is no change of an allocated device, and is
never held back), and the publisher lays them onto the devices of each GPU last.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpuslice.dra.names import (
    DEFRAG_TAINT_KEY,
    MIG_FAILED_TAINT_KEY,
    PENDING_TAINT_KEY,
    RECONFIGURING_TAINT_KEY,
    UNHEALTHY_TAINT_KEY,
)
from gpuslice.jsontypes import Object

STATUS_TAINT_KEYS = frozenset({UNHEALTHY_TAINT_KEY, RECONFIGURING_TAINT_KEY, MIG_FAILED_TAINT_KEY, DEFRAG_TAINT_KEY})
AGENT_TAINT_KEYS = STATUS_TAINT_KEYS | {PENDING_TAINT_KEY}


def without_agent_taints(device: Mapping[str, Any]) -> dict[str, Any]:
    clean = {k: v for k, v in device.items() if k != "taints"}
    taints = [t for t in device.get("taints") or [] if t.get("key") not in AGENT_TAINT_KEYS]
    return {**clean, "taints": taints} if taints else clean


def with_status_taints(device: Mapping[str, Any], taints: Sequence[Object]) -> dict[str, Any]:
    """``device`` with ``taints`` (statuses of its GPU) in place of any it had."""
    kept = [t for t in device.get("taints") or [] if t.get("key") not in STATUS_TAINT_KEYS]
    merged = kept + sorted((dict(t) for t in taints), key=lambda t: str(t["key"]))
    clean = {k: v for k, v in device.items() if k != "taints"}
    return {**clean, "taints": merged} if merged else clean


def status_taints_by_gpu(*sources: Mapping[str, Sequence[Object]]) -> dict[str, list[Object]]:
    merged: dict[str, list[Object]] = {}
    for source in sources:
        for gpu, taints in source.items():
            merged.setdefault(gpu, []).extend(taints)
    return merged
