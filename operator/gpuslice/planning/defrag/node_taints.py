"""The taint of a GPU being freed for a waiting pod (defragmentation), as its node agent lays it (pure).

While a policy's ``status.defragmentation.inFlight`` records a move on this node that the
controller took up (any phase but ``Requested``, which only the controller may write past) and
that has not expired, every device of that GPU but the one the waiting claim asks for carries
``gpuslice.dev/defrag=<move id>:NoSchedule``: the scheduler then puts no replacement of a moved
pod (nor anything else) there, and the device left untainted goes to the waiting claim (the
tenancy rule refuses it to any other: ``planning.defrag.rule``). Like the health taints it is a
status, not part of what a device is, so the safety layer never holds it back, and it applies to
allocated devices too (they keep running; nothing new lands beside them). The agent judges expiry
on its own clock, so a taint outlives a move whose executor died by at most one resync.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any, Final

from gpuslice.dra.names import DEFRAG_TAINT_KEY
from gpuslice.dra.wire import device_gpu
from gpuslice.planning.node.node_pool import PlannedSlice

REQUESTED: Final = "Requested"  # a move's phase until the controller has judged it


def parse_time(text: str) -> datetime.datetime | None:
    try:
        moment = datetime.datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=datetime.UTC)


def freeing_on_node(policies: Iterable[Mapping[str, Any]], node: str,
                    now: datetime.datetime) -> dict[str, tuple[str, str]]:
    """GPU UUID -> (the device left untainted, the move's id), for this node's unexpired moves that
    the controller took up."""
    found: dict[str, tuple[str, str]] = {}
    for body in policies:
        for move in ((body.get("status") or {}).get("defragmentation") or {}).get("inFlight") or []:
            expires = parse_time(str(move.get("expires", "")))
            if move.get("phase", REQUESTED) == REQUESTED:
                continue  # anyone with the defrag role may request a move: it counts once the controller judged it
            if move.get("node") == node and move.get("gpu") and expires is not None and expires > now:
                found[str(move["gpu"])] = (str(move.get("device", "")), str(move.get("id", "")))
    return found


def with_defrag_taints(slices: Iterable[PlannedSlice],
                       freeing: Mapping[str, tuple[str, str]]) -> tuple[PlannedSlice, ...]:
    """``slices`` with the devices of GPUs being freed tainted, but the one each keeps for its pod.
    The slices come from the status step (planning.node.pool_safety.with_statuses), which took any
    earlier defrag taint off."""
    def taint(device: dict[str, Any]) -> dict[str, Any]:
        gpu = device_gpu(device) or ""
        if gpu not in freeing or device.get("name") == freeing[gpu][0]:
            return device
        added = {"key": DEFRAG_TAINT_KEY, "value": freeing[gpu][1], "effect": "NoSchedule"}
        return {**device, "taints": [*(device.get("taints") or []), added]}

    if not freeing:
        return tuple(slices)
    return tuple(replace(s, devices=tuple(taint(d) for d in s.devices)) for s in slices)
