"""Figure 1: one trace of inference pods, served five ways on 16 fake H100s by the real scheduler (the fifth,
shared capacity over four tenants with maxMemory, in bench.limited_packing)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from gpuslice.bench.harness import BenchCluster
from gpuslice.bench.layouts import GIB, H100, fleet_share, packing_layouts, shared_layout
from gpuslice.bench.limited_packing import TENANTS, budgets_in_force, limited_mode, place_limited, webhook_latency
from gpuslice.bench.packing import optimal_packing
from gpuslice.bench.trace import TraceSpec, inference_trace
from gpuslice.bench.workload import apply_layout, clear_layout, create_claims, ensure_namespace, place_pods
from gpuslice.dra.quantity import quantity_bytes

NODES = ("bench-pack-1", "bench-pack-2")  # 2 nodes x 8 GPUs = 16 GPUs
NAMESPACE = "bench-packing"
LIMITED = tuple(f"bench-packing-t{i}" for i in range(TENANTS))


async def _limited(cluster: BenchCluster, trace: Sequence[int], optimum: int, shared: dict[str, Any] | None,
                   uids: dict[str, str], say: Callable[[str], None]) -> dict[str, Any]:
    """Shared capacity with four tenants whose maxMemory sums to the fleet's memory."""
    budget = fleet_share(len(NODES) * 8, TENANTS)
    layout = shared_layout(LIMITED, max_memory=budget)
    for namespace in LIMITED:
        await ensure_namespace(cluster, namespace)
    await cluster.start_webhook()
    try:
        await apply_layout(cluster, layout, uids)
        await budgets_in_force(cluster, str(layout.policies[0]["metadata"]["name"]), LIMITED, budget)
        placement, seen, needs = await place_limited(cluster, layout, LIMITED, trace,
                                                     quantity_bytes(budget))
        latency = await webhook_latency(cluster)
        mode = limited_mode(layout, placement, seen, needs, optimum, shared, latency, budget)
        say(f"packing: shared-limited: {mode['pods_placed']} pods, {mode['memory_used_gib']:.0f} GiB used,"
            f" {mode['moments_over_limit']} moments over a budget in {mode['claim_writes_watched']} writes,"
            f" webhook p50 {latency['p50_ms']:.0f} ms p99 {latency['p99_ms']:.0f} ms")
        await clear_layout(cluster, layout, LIMITED, NODES)
        return mode
    finally:
        await cluster.stop_webhook()


async def packing_figure(cluster: BenchCluster, spec: TraceSpec, say: Callable[[str], None]) -> dict[str, Any]:
    trace = inference_trace(spec)
    capacity_gib = H100.memory // GIB  # 79: needs are whole GiB
    optimum = optimal_packing(trace, len(NODES) * 8, capacity_gib)
    say(f"packing: trace of {len(trace)} pods, {sum(trace)} GiB; optimum {optimum.value} GiB"
        f" ({'proven' if optimum.proven else 'search limit hit: bound ' + str(optimum.bound)})")
    uids = await cluster.create_nodes(NODES)
    await ensure_namespace(cluster, NAMESPACE)
    for node in NODES:
        await cluster.start_agent(node)
    modes: dict[str, Any] = {}
    try:
        for layout in packing_layouts([NAMESPACE]):
            publish_seconds = await apply_layout(cluster, layout, uids)
            bodies = {f"c-{i:04d}": layout.claim(NAMESPACE, f"c-{i:04d}", need) for i, need in enumerate(trace)}
            served = {name: body for name, body in bodies.items() if body is not None}
            await create_claims(cluster, list(served.values()))
            placement = await place_pods(cluster, NAMESPACE, list(served), concurrency=1)
            needs = dict(zip(bodies, trace, strict=True))
            used = sum(needs[c] for c in placement.allocations) * GIB
            allocated = 0
            for claim, (request, consumed) in placement.allocations.items():
                choices = layout.choices(needs[claim])
                index = int(request.split("/c")[1]) if "/c" in request else 0
                allocated += consumed or choices[index].gives
            modes[layout.name] = {
                "title": layout.title,
                "pods_placed": len(placement.allocations),
                "pods_bound": placement.bound,
                "memory_used_gib": round(used / GIB, 1),
                "memory_allocated_gib": round(allocated / GIB, 1),
                "ratio_to_optimum": round(used / GIB / optimum.value, 4),
                "scheduler_cpu_s": round(placement.scheduler_cpu, 2),
                "publish_s": round(publish_seconds, 1),
            }
            say(f"packing: {layout.name}: {len(placement.allocations)} pods, {used / GIB:.0f} GiB used,"
                f" {allocated / GIB:.0f} GiB allocated")
            await clear_layout(cluster, layout, NAMESPACE, NODES)
        modes["shared-limited"] = await _limited(cluster, trace, optimum.value, modes.get("shared"), uids, say)
    except Exception as error:
        raise cluster.failed({"modes_measured": modes}, error) from error
    finally:
        await cluster.stop_agents()
        await cluster.delete_nodes(NODES)
    whole = modes.get("whole", {}).get("pods_placed") or 1
    for mode in modes.values():
        mode["pods_vs_whole"] = round(mode["pods_placed"] / whole, 2)
    return {
        "gpus": len(NODES) * 8, "gpu": H100.product_name, "gpu_memory_mib": H100.memory // 1024**2,
        "trace": {"seed": spec.seed, "pods": len(trace), "needs_gib": list(trace), "total_gib": sum(trace),
                  "distribution": f"log-normal, median {spec.median_gib} GiB, sigma {spec.sigma},"
                                  f" clipped to {spec.low_gib}-{spec.high_gib} GiB"},
        "optimum_gib": optimum.value, "optimum_proven": optimum.proven, "optimum_bound_gib": optimum.bound,
        "modes": modes,
    }
