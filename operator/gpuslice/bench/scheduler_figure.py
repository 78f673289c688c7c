"""Figure 2: kube-scheduler's CPU time per placed pod, per layout, against whole-GPU devices.

Two views. Same fleet: N nodes x 8 GPUs filled to capacity (each layout places as many pods
as it has room for). Same pods: as many pods in every layout (whole GPUs then need more
nodes). Claims are made before the pods, so the scheduler's CPU counts allocating and
binding, not claim creation. The agents publish each layout and are stopped before the
pods come, so the two cores measure the scheduler, not a fleet of agents reacting to claims.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuslice.bench.fleet import start_fleet
from gpuslice.bench.harness import BenchCluster, pprof_top, scheduler_profile
from gpuslice.bench.layouts import Layout, cost_layouts
from gpuslice.bench.workload import apply_layout, clear_layout, create_claims, ensure_namespace, place_pods
from gpuslice.coordinates import SLICES
from gpuslice.dra.names import DRIVER
from gpuslice.dra.slice_wire import slice_devices, slice_node
from gpuslice.kube.client import KubeError

NAMESPACE = "bench-cost"


@dataclass(frozen=True)
class Scenario:
    nodes: int
    layout: Layout
    pods: int
    views: tuple[str, ...]  # "same_fleet", "same_pods"


def scenarios(fleet_sizes: Sequence[int], same_pods: int) -> list[Scenario]:
    """Every (node count, layout) once, in the order of node counts (nodes are made, not remade)."""
    layouts = cost_layouts([NAMESPACE])
    wanted: dict[tuple[int, str], Scenario] = {}
    for n in fleet_sizes:
        for layout in layouts:
            wanted[(n, layout.name)] = Scenario(n, layout, layout.capacity_per_gpu * 8 * n, ("same_fleet",))
    for layout in layouts if same_pods > 0 else []:
        n = math.ceil(same_pods / (layout.capacity_per_gpu * 8))
        key = (n, layout.name)
        if key in wanted and wanted[key].pods == same_pods:
            wanted[key] = Scenario(n, layout, same_pods, (*wanted[key].views, "same_pods"))
        else:
            wanted[(n, layout.name + "@pods")] = Scenario(n, layout, same_pods, ("same_pods",))
    return sorted(wanted.values(), key=lambda s: (s.nodes, s.layout.name))


def node_names(count: int) -> list[str]:
    return [f"bench-cost-{i:04d}" for i in range(1, count + 1)]


async def _resize(cluster: BenchCluster, have: dict[str, str], want: int, kubeconfigs: dict[str, Path]) -> None:
    names = node_names(want)
    extra = [n for n in have if n not in names]
    await cluster.delete_nodes(extra)
    for n in extra:
        del have[n]
        kubeconfigs.pop(n, None)
    missing = [n for n in names if n not in have]
    have.update(await cluster.create_nodes(missing))
    for n in missing:
        kubeconfigs[n] = await cluster.agent_kubeconfig(n)


async def _drop_devices(cluster: BenchCluster) -> None:
    with contextlib.suppress(KubeError):
        await cluster.api.delete(SLICES, fieldSelector=f"spec.driver={DRIVER}")


async def scheduler_figure(cluster: BenchCluster, fleet_sizes: Sequence[int], same_pods: int,
                           say: Callable[[str], None], layouts: Sequence[str] = (),
                           profile_dir: Path | None = None) -> dict[str, Any]:
    """With ``profile_dir``, the scheduler is profiled while it places the pods of the largest
    fleet's runs (profiles and ``go tool pprof -top`` summaries land there)."""
    await ensure_namespace(cluster, NAMESPACE)
    nodes: dict[str, str] = {}
    kubeconfigs: dict[str, Path] = {}
    measured: list[dict[str, Any]] = []
    try:
        for scenario in scenarios(fleet_sizes, same_pods):
            if layouts and scenario.layout.name not in layouts:
                continue
            await _resize(cluster, nodes, scenario.nodes, kubeconfigs)
            layout = scenario.layout
            fleet = None if layout.whole_gpu else await start_fleet(dict(kubeconfigs))
            try:
                await apply_layout(cluster, layout, nodes, within=1200)
            finally:
                if fleet is not None:
                    await fleet.close()
            slices = [s for s in await cluster.api.list(SLICES) if slice_node(s["spec"]) in nodes]
            devices = sum(len(slice_devices(s["spec"])) for s in slices) // max(1, len(nodes))
            claims = [layout.claim(NAMESPACE, f"c-{i:05d}", 10) for i in range(scenario.pods)]
            await create_claims(cluster, [c for c in claims if c is not None], concurrency=8)
            profiling = None
            if profile_dir is not None and scenario.nodes == max(fleet_sizes) and "same_fleet" in scenario.views:
                seconds = 20 if scenario.pods > 500 else 5
                path = profile_dir / f"scheduler-{scenario.nodes}x8-{layout.name}.pprof"
                profiling = asyncio.create_task(scheduler_profile(cluster, seconds, path))
            placement = await place_pods(cluster, NAMESPACE, [f"c-{i:05d}" for i in range(scenario.pods)],
                                         concurrency=8, within=3600)
            if profiling is not None and profile_dir is not None:
                with contextlib.suppress(Exception):
                    top = pprof_top(await profiling)
                    (profile_dir / f"scheduler-{scenario.nodes}x8-{layout.name}.top.txt").write_text("\n".join(top))
            row = {"nodes": scenario.nodes, "fleet": f"{scenario.nodes} nodes x 8", "layout": layout.name,
                   "title": layout.title, "pods": scenario.pods, "bound": placement.bound,
                   "devices": devices, "views": list(scenario.views),
                   "scheduler_cpu_s": round(placement.scheduler_cpu, 2),
                   "ms_per_pod": round(1000 * placement.scheduler_cpu / max(1, placement.bound), 3),
                   "create_s": round(placement.create_seconds, 1), "bind_s": round(placement.bind_seconds, 1),
                   "pods_per_s": round(placement.bound / max(placement.bind_seconds, 1e-9), 1)}
            measured.append(row)
            say(f"scheduler: {row['fleet']}, {layout.name}: {placement.bound}/{scenario.pods} pods bound,"
                f" {row['ms_per_pod']:.2f} ms CPU per pod, {row['pods_per_s']} pods/s")
            await clear_layout(cluster, layout, NAMESPACE, list(nodes), devices_gone=_drop_devices)
    except Exception as error:
        raise cluster.failed(summarize(measured) if measured else {}, error) from error
    finally:
        await cluster.delete_nodes(list(nodes))
        await _drop_devices(cluster)
    return summarize(measured)


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Ratios to whole-GPU devices, per view; the worst layout per view is the figure's verdict."""
    same_fleet, same_pods = [], []

    def ratio(row: dict[str, Any], base: dict[str, Any] | None) -> float | None:
        return round(row["ms_per_pod"] / base["ms_per_pod"], 2) if base and base["ms_per_pod"] > 0 else None

    for row in rows:
        if "same_fleet" in row["views"]:
            base = next((r for r in rows if r["layout"] == "whole" and r["nodes"] == row["nodes"]
                         and "same_fleet" in r["views"]), None)
            same_fleet.append({**row, "vs_whole": ratio(row, base)})
        if "same_pods" in row["views"]:
            base = next((r for r in rows if r["layout"] == "whole" and "same_pods" in r["views"]), None)
            same_pods.append({**row, "vs_whole": ratio(row, base)})

    def worst(view: list[dict[str, Any]]) -> float | None:
        """The worst ratio, or None (not measured) when a layout has none: a run that lost its
        whole-GPU baseline must not read as a layout costing nothing."""
        ratios = [r["vs_whole"] for r in view if r["layout"] != "whole"]
        return max(ratios) if ratios and None not in ratios else None

    return {"same_fleet": same_fleet, "same_pods": same_pods, "worst_ratio_same_fleet": worst(same_fleet),
            "worst_ratio_same_pods": worst(same_pods)}
