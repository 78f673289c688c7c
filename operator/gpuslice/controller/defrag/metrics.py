"""Prometheus metrics of defragmentation: what was moved, what was freed, and what stood in the way.
Labels are bounded: policy names, who asked (``auto``, ``manual``), and a fixed set of reasons."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

EVICTIONS = Counter("gpuslice_defrag_evictions", "Pods evicted to free a GPU for a waiting pod, by who"
                    " asked (auto, or manual: gpuslice defrag --apply).", ["policy", "by"])
FREED = Counter("gpuslice_defrag_gpus_freed", "Moves that ended with the waiting claim allocated, by"
                " who asked (auto, manual).", ["policy", "by"])
FAILED = Counter("gpuslice_defrag_moves_failed", "Moves given up, by reason (Disruption: a PodDisruptionBudget"
                 " refused an eviction; Timeout; NotTainted: the node agent did not taint the GPU; Unmovable: a pod"
                 " of the plan may no longer move; Gone: the waiting claim went; Invalid: a requested move the"
                 " controller would not make itself, refused).", ["policy", "reason"])
BLOCKED = Counter("gpuslice_defrag_plans_blocked", "Auto mode: pods that waited long enough but got no move, by"
                  " reason (Budget: maxEvictionsPerHour; NoRoom; Busy; Failed: a move for its claim failed within"
                  " the hour; why its claim would not be allocated or is not planned for: OverMemory, NotAdmitted,"
                  " MemoryUnknown, LimitsNotInForce, ClassNotInForce, MadeBeforeQuota, Selectors, NodeFit, Claims,"
                  " Shared; or what blocked the best GPU: Bare, Disruption, OptedOut, NotATenant, NowhereToGo, Job,"
                  " DaemonSet, StandaloneClaim, ...).", ["policy", "reason"])
WASTED = Counter("gpuslice_defrag_evictions_wasted", "Pods evicted for a move that then failed (its waiting claim"
                 " not allocated): moved for nothing. Auto's count against maxEvictionsPerHour all the same.",
                 ["policy", "by"])
IN_FLIGHT = Gauge("gpuslice_defrag_moves_in_flight", "GPUs being freed now.", ["policy"])


def who(by: str) -> str:
    return "auto" if by.startswith("controller") else "manual"
