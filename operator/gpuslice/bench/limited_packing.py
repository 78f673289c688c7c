"""Figure 1, fifth way: the same trace in shared capacity, split over four tenants whose maxMemory
sums to the fleet's memory. Packing as shared does and bounding every tenant exactly: the
maxMemory webhook charges each allocation to its tenant's ledger, and the figure watches every
write to every tenant's claims to count the moments any tenant held more than its budget."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from gpuslice.bench.harness import BenchCluster, wait_until
from gpuslice.bench.layouts import Layout
from gpuslice.bench.workload import Placement, create_claims, place_pods_across
from gpuslice.coordinates import claims_in, policy_path
from gpuslice.dra.quantity import quantity_bytes
from gpuslice.dra.wire import allocation_results, consumed_quantity
from gpuslice.kube.watch import watch

TENANTS = 4


@dataclass
class Budgets:
    """What each tenant holds after every write to its claims; the writes after which one held more
    than its budget."""

    budget: int
    held: dict[str, dict[str, int]] = field(default_factory=dict)  # namespace -> claim -> bytes
    most: dict[str, int] = field(default_factory=dict)
    over: int = 0
    writes: int = 0

    def seen(self, kind: str | None, obj: dict[str, Any]) -> None:
        namespace, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        bytes_ = sum(quantity_bytes(consumed_quantity(r) or "0") for r in allocation_results(obj, driver=None))
        claims = self.held.setdefault(namespace, {})
        if kind == "DELETED" or not bytes_:
            claims.pop(name, None)
        else:
            claims[name] = bytes_
        self.writes += 1
        total = sum(claims.values())
        self.most[namespace] = max(self.most.get(namespace, 0), total)
        self.over += total > self.budget


async def budgets_in_force(cluster: BenchCluster, policy: str, tenants: Sequence[str], budget: str) -> None:
    async def recorded() -> bool:
        status = (await cluster.api.get(policy_path(policy))).get("status") or {}
        found = {a["namespace"] for a in status.get("admittedTenants") or []
                 if (a.get("limits") or {}).get("maxMemory") == budget}
        return set(tenants) <= found

    await wait_until(recorded, 180, f"every tenant's maxMemory {budget} to be in force")


def review_quantiles(text: str, verdict: str) -> dict[str, float]:
    """p50 and p99 of the webhook's answers to allocations with ``verdict``, in ms (the upper bound of
    the histogram bucket each falls in), and how many it gave, from its metrics' text."""
    buckets = [(float(le), float(v)) for le, v in re.findall(
        r'gpuslice_webhook_review_seconds_bucket\{le="([0-9.e+-]+)",operation="allocate",verdict="'
        + verdict + r'"\} ([0-9.e+]+)', text)]
    total = max((v for _, v in buckets), default=0.0)

    def quantile(q: float) -> float:
        return next((le for le, v in buckets if v >= q * total), float("inf")) * 1000

    return {"reviews": total, "p50_ms": quantile(0.5), "p99_ms": quantile(0.99)}


async def webhook_latency(cluster: BenchCluster) -> dict[str, float]:
    """The allocations the webhook admitted (each wrote its charge): their p50 and p99."""
    async with aiohttp.ClientSession() as session, session.get(
            f"http://127.0.0.1:{cluster.webhook_metrics}/metrics") as response:
        text = await response.text()
    admitted, refused = review_quantiles(text, "allowed"), review_quantiles(text, "refused")
    return {**admitted, "refused_reviews": refused["reviews"], "refused_p50_ms": refused["p50_ms"]}


async def place_limited(cluster: BenchCluster, layout: Layout, tenants: Sequence[str], trace: Sequence[int],
                        budget: int) -> tuple[Placement, Budgets, dict[str, int]]:
    """The trace's pods in order, pod i in tenant i mod 4, each with its claim made first. Returns the
    placement, what the watch saw, and each claim's need in GiB."""
    bodies: dict[str, dict[str, Any]] = {}
    order: list[tuple[str, str]] = []
    needs: dict[str, int] = {}
    for i, need in enumerate(trace):
        namespace, name = tenants[i % len(tenants)], f"c-{i:04d}"
        body = layout.claim(namespace, name, need)
        if body is not None:
            bodies[name], needs[name] = body, need
            order.append((namespace, name))
    for namespace in tenants:
        await create_claims(cluster, [b for b in bodies.values() if b["metadata"]["namespace"] == namespace])
    seen, stop = Budgets(budget), asyncio.Event()
    watchers = [asyncio.create_task(watch(cluster.api, claims_in(ns),
                                          seen.seen, stop)) for ns in tenants]
    try:
        placement = await place_pods_across(cluster, order, concurrency=1)
        await asyncio.sleep(2)  # the watches see the last writes
    finally:
        stop.set()
        for task in watchers:
            task.cancel()
        for task in watchers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
    return placement, seen, needs


def limited_mode(layout: Layout, placement: Placement, seen: Budgets, needs: Mapping[str, int], optimum: int,
                 shared: Mapping[str, Any] | None, latency: Mapping[str, float], budget: str) -> dict[str, Any]:
    gib = 1024**3
    used = sum(needs[c] for c in placement.allocations) * gib
    allocated = sum(consumed for _, consumed in placement.allocations.values())
    cpu_per_pod = placement.scheduler_cpu / max(1, len(placement.allocations))
    shared_per_pod = (shared["scheduler_cpu_s"] / max(1, shared["pods_placed"])) if shared else None
    return {
        "title": layout.title, "pods_placed": len(placement.allocations), "pods_bound": placement.bound,
        "refused_by_budget": placement.refused,
        "memory_used_gib": round(used / gib, 1), "memory_allocated_gib": round(allocated / gib, 1),
        "ratio_to_optimum": round(used / gib / optimum, 4), "scheduler_cpu_s": round(placement.scheduler_cpu, 2),
        "scheduler_cpu_vs_shared": round(cpu_per_pod / shared_per_pod, 3) if shared_per_pod else None,
        "budget_per_tenant": budget, "tenants": TENANTS,
        "most_held_gib": {ns: round(b / gib, 1) for ns, b in sorted(seen.most.items())},
        "claim_writes_watched": seen.writes, "moments_over_limit": seen.over,
        "webhook_admitted": latency["reviews"], "webhook_p50_ms": latency["p50_ms"],
        "webhook_p99_ms": latency["p99_ms"],
        "webhook_refused": latency["refused_reviews"], "webhook_refused_p50_ms": latency["refused_p50_ms"],
    }
