"""Targets, verdicts, the printed table and the history (pure: dicts in, dicts and text out)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

HISTORY_KEEP = 20
REGRESSION = 0.10  # a figure 10% worse than the previous run's is called a regression


@dataclass(frozen=True)
class Target:
    key: str  # a dotted path into results["figures"]
    label: str
    op: Literal["<=", ">=", "=="]
    limit: float
    better: Literal["lower", "higher"]
    unit: str = ""

    def met(self, value: float | None) -> bool | None:
        if value is None:
            return None
        return {"<=": value <= self.limit, ">=": value >= self.limit, "==": value == self.limit}[self.op]


TARGETS: tuple[Target, ...] = (
    Target("packing.modes.shared.ratio_to_optimum", "packing: shared capacity, memory vs optimum", ">=", 0.95,
           "higher"),
    Target("packing.modes.memory.ratio_to_optimum", "packing: memory slices, memory vs optimum", ">=", 0.95, "higher"),
    Target("packing.modes.shared-limited.ratio_to_optimum", "packing: shared, 4 tenants with maxMemory, vs optimum",
           ">=", 0.95, "higher"),
    Target("packing.modes.shared-limited.moments_over_limit", "packing: shared with maxMemory, writes over a budget",
           "==", 0, "lower"),
    Target("packing.modes.shared-limited.scheduler_cpu_vs_shared",
           "packing: scheduler CPU per pod, maxMemory vs shared", "<=", 1.1, "lower", "x"),
    Target("packing.modes.shared.pods_vs_whole", "packing: shared capacity, pods vs whole GPU", ">=", 3.0, "higher",
           "x"),
    Target("packing.modes.memory.pods_vs_whole", "packing: memory slices, pods vs whole GPU", ">=", 3.0, "higher",
           "x"),
    Target("scheduler.worst_ratio_same_fleet", "scheduler CPU per pod vs whole GPU, same fleet (worst layout)", "<=",
           1.0, "lower", "x"),
    Target("scheduler.worst_ratio_same_pods", "scheduler CPU per pod vs whole GPU, same pods (worst layout)", "<=",
           1.0, "lower", "x"),
    Target("scale.steady_writes", "scale: API writes in steady state", "==", 0, "lower"),
    # What gpuslice asks of the API server (its audit log), not what it counts itself.
    Target("scale.converge_requests_per_node", "scale: gpuslice's requests per node to converge", "<=", 10, "lower"),
    Target("scale.steady_tenants_ratio", "scale: steady requests a minute, twice the tenants vs once", "<=", 1.2,
           "lower", "x"),
    Target("scale.steady_tenant_namespace_requests", "scale: steady requests naming a tenant namespace", "==", 0,
           "lower"),
    Target("scale.policy_watch_bytes_per_agent_per_pod", "scale: policy watch bytes per agent per bound pod", "<=", 10,
           "lower", " B"),
    Target("scale.controller_peak_rss_mib", "scale: controller peak RSS", "<=", 300, "lower", " MiB"),
    Target("scale.agent_peak_rss_mib", "scale: one agent process peak RSS", "<=", 100, "lower", " MiB"),
    Target("fragmentation.waiting_cut", "fragmentation: whole-GPU pods' waiting with room, cut by Auto", ">=", 0.8,
           "higher"),
    Target("fragmentation.evictions_vs_fewest", "fragmentation: Auto's evictions vs the fewest possible", "<=", 1.5,
           "lower", "x"),
    Target("topology.aligned.share_worst", "topology: aligned templates, multi-GPU jobs across NUMA without NVLink",
           "==", 0, "lower"),
    Target("topology.aligned_share_vs_unaligned", "topology: share of multi-GPU jobs on NVLink, aligned vs unaligned",
           ">=", 1.0, "higher", "x"),
    Target("topology.modelled_work_ratio", "topology: modelled throughput (a model), aligned vs unaligned", ">=",
           1.0, "higher", "x"),
)


def lookup(figures: Mapping[str, Any], key: str) -> Any:
    node: Any = figures
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def failed(figures: Mapping[str, Any], key: str) -> bool:
    """Whether the figure a dotted key belongs to failed (what it measured before is not judged)."""
    figure = figures.get(key.split(".", 1)[0])
    return isinstance(figure, Mapping) and "error" in figure


def verdicts(figures: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each target met, not met, or None: not measured, or its figure failed part-way (a partial
    figure's numbers are shown, never judged)."""
    found = []
    for target in TARGETS:
        value = lookup(figures, target.key)
        number = float(value) if isinstance(value, int | float) else None
        broken = failed(figures, target.key)
        found.append({"key": target.key, "label": target.label, "target": f"{target.op} {target.limit:g}{target.unit}",
                      "value": number, "met": None if broken else target.met(number), "failed": broken})
    return found


def headline(figures: Mapping[str, Any]) -> dict[str, float]:
    """The numbers the history keeps, flat; none of a failed figure (it is no baseline)."""
    figures = {name: f for name, f in figures.items() if not failed(figures, name)}
    keys = [t.key for t in TARGETS] + [
        "packing.modes.whole.pods_placed", "packing.modes.shared.pods_placed", "packing.modes.memory.pods_placed",
        "packing.modes.mig-static.pods_placed", "scale.converge_seconds", "scale.converge_requests",
        "scale.steady.requests_per_minute", "scale.steady_pending.requests_per_minute",
        "planner.validate_10k_gpus_ms", "fragmentation.off.gpu_hours_waiting_with_room",
        "fragmentation.auto.gpu_hours_waiting_with_room", "fragmentation.auto.evictions",
        "topology.unaligned.share_aligned", "topology.aligned.share_aligned", "topology.unaligned.mean_wait_min",
        "topology.aligned.mean_wait_min",
    ]
    flat = {}
    for key in keys:
        value = lookup(figures, key)
        if isinstance(value, int | float):
            flat[key] = float(value)
    for view in ("same_fleet", "same_pods"):
        for row in lookup(figures, f"scheduler.{view}") or []:
            flat[f"scheduler.{view}.{row['fleet']}.{row['layout']}.ms_per_pod"] = float(row["ms_per_pod"])
    return flat


def regressions(current: Mapping[str, float], previous: Mapping[str, float]) -> list[str]:
    """Figures that moved more than REGRESSION the wrong way since the previous run."""
    lower_better = {t.key for t in TARGETS if t.better == "lower"} | {"scale.converge_seconds",
                                                                      "scale.converge_requests",
                                                                      "planner.validate_10k_gpus_ms"}
    found = []
    for key, value in current.items():
        before = previous.get(key)
        if before is None or before == 0:
            continue
        lower = key in lower_better or key.endswith("ms_per_pod")
        change = (value - before) / abs(before)
        if (lower and change > REGRESSION) or (not lower and change < -REGRESSION):
            found.append(f"{key}: {before:g} -> {value:g} ({change:+.0%})")
    return found


def latest(history: Sequence[Mapping[str, Any]], size: str) -> dict[str, float]:
    """Each figure's latest value among the runs of ``size``: a run that failed or skipped a figure
    leaves that figure's baseline where it was."""
    found: dict[str, float] = {}
    for run in history:
        if run.get("size") == size:
            found.update(run.get("figures") or {})
    return found


def trim_history(history: Sequence[Mapping[str, Any]], entry: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [dict(h) for h in [*history, entry][-HISTORY_KEEP:]]


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.2f}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


def _ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}x"


def verdict_word(met: bool | None, broken: bool = False) -> str:
    if broken:
        return "FAILED"
    return {True: "MET", False: "NOT MET", None: "not measured"}[met]


def render_text(results: Mapping[str, Any]) -> str:
    """The whole report as plain text (what `make bench` prints)."""
    figures = results["figures"]
    lines = [f"gpuslice bench — {results['meta'].get('when', '')}",
             f"machine: {results['meta'].get('machine', '')}", f"versions: {results['meta'].get('versions', '')}", ""]
    for name, error in (results.get("failed") or {}).items():
        lines.append(f"FAILED: {name}: {error}")
    if results.get("failed"):
        lines.append("")
    packing = figures.get("packing")
    if packing and "modes" in packing:
        lines.append(f"1. Packing: {packing['trace']['pods']} inference pods ({packing['trace']['total_gib']} GiB"
                     f" asked) on {packing['gpus']} x {packing['gpu']}; optimum {packing['optimum_gib']} GiB"
                     f" ({'exact' if packing['optimum_proven'] else 'upper bound'})")
        lines.append(f"   {'way of serving':<44} {'pods':>5} {'x whole':>8} {'GiB used':>9} {'GiB alloc':>10}"
                     f" {'vs optimum':>11}")
        for mode in packing["modes"].values():
            lines.append(f"   {mode['title']:<44} {mode['pods_placed']:>5} {mode['pods_vs_whole']:>8.2f}"
                         f" {mode['memory_used_gib']:>9.0f} {mode['memory_allocated_gib']:>10.0f}"
                         f" {mode['ratio_to_optimum']:>10.1%}")
        lines.append("")
    scheduler = figures.get("scheduler")
    if scheduler:
        lines.append("2. Scheduler CPU per placed pod (kube-scheduler's own CPU time / pods bound)")
        lines.append(f"   {'view':<10} {'fleet':<16} {'layout':<14} {'pods':>6} {'devices':>8} {'ms/pod':>8}"
                     f" {'vs whole':>9} {'pods/s':>7}")
        for view in ("same_fleet", "same_pods"):
            for row in scheduler.get(view) or []:
                lines.append(f"   {view:<10} {row['fleet']:<16} {row['layout']:<14} {row['pods']:>6}"
                             f" {row['devices']:>8} {row['ms_per_pod']:>8.2f} {_ratio(row['vs_whole']):>9}"
                             f" {row['pods_per_s']:>7.1f}")
        for note in scheduler.get("notes") or []:
            lines.append(f"   note: {note}")
        lines.append("")
    scale = figures.get("scale")
    if scale and "nodes" in scale:
        lines.append(f"3. Scale: {scale['nodes']} nodes x {scale['gpus_per_node']} GPUs, {scale['policies']} policies,"
                     f" {scale['namespaces']} tenant namespaces ({scale['harness']})")
        for key, label in (("converge_seconds", "policies applied -> every pool published and policy Ready (s)"),
                           ("converge_requests", "API requests during convergence"),
                           ("converge_writes", "API writes during convergence"),
                           ("steady_seconds", "steady state observed (s)"),
                           ("steady_requests", "API requests in steady state"),
                           ("steady_writes", "API writes in steady state"),
                           ("controller_cpu_converge_s", "controller CPU during convergence (s)"),
                           ("controller_cpu_steady_s", "controller CPU in steady state (s)"),
                           ("agents_cpu_converge_s", "all agents' CPU during convergence (s, harness process)"),
                           ("agents_cpu_steady_s", "all agents' CPU in steady state (s, harness process)"),
                           ("edit_requests", "editing every policy (a tenant added): API requests"),
                           ("edit_agent_reads", "  of which the agents' reads"),
                           ("taint_devices", "tainting one policy: its devices"),
                           ("taint_seconds", "  seconds until every one is tainted"),
                           ("taint_rules", "  DeviceTaintRules made"),
                           ("taint_writes", "  API writes"),
                           ("controller_peak_rss_mib", "controller peak RSS (MiB)"),
                           ("agent_peak_rss_mib", "one real agent process, peak RSS (MiB)")):
            lines.append(f"   {label:<66} {_fmt(scale.get(key))}")
        for verb_resource, count in (scale.get("converge_by_resource") or {}).items():
            lines.append(f"     convergence {verb_resource:<58} {count}")
        for verb_resource, count in (scale.get("steady_by_resource") or {}).items():
            lines.append(f"     steady      {verb_resource:<58} {count}")
        lines.append("")
    planner = figures.get("planner")
    if planner and "plan_node_ms" in planner:
        lines.append("4. Planner speed")
        for mode, ms in planner["plan_node_ms"].items():
            lines.append(f"   plan one node of 8 GPUs, {mode:<31} {ms:>8.2f} ms")
        lines.append(f"   validate a policy against {planner['validate_gpus']:,} GPUs        "
                     f" {planner['validate_10k_gpus_ms']:>8.1f} ms")
        lines.append("")
    topology = figures.get("topology")
    if topology and "aligned" in topology:
        lines += topology_lines(topology)
    lines.append("Targets")
    for v in results["verdicts"]:
        value = "—" if v["value"] is None else _fmt(v["value"])
        lines.append(f"   {verdict_word(v['met'], v.get('failed', False)):<13} {v['label']:<66} {value:>8}"
                     f" (target {v['target']})")
    if results.get("regressions"):
        lines.append("")
        lines.append("Regressions since the previous run")
        lines += [f"   {r}" for r in results["regressions"]]
    return "\n".join(lines)


def topology_lines(topology: Mapping[str, Any]) -> list[str]:
    """Figure 6, both runs side by side (the throughput is the model's: bench.training)."""
    spec = topology["spec"]
    lines = [f"6. Topology: {spec['jobs']} training jobs of 1-8 GPUs on {spec['gpus']} GPUs"
             f" ({', '.join(f'{n} x {s}' for s, n in spec['fleet'].items())}), {spec['minutes']:.0f} simulated minutes",
             f"   {'':<44} {'unaligned':>10} {'aligned':>10}"]
    rows = (("jobs placed", "placed"), ("mean wait (min)", "mean_wait_min"), ("p95 wait (min)", "p95_wait_min"),
            ("multi-GPU jobs sharing an NVLink domain", "share_nvlink"), ("  sharing a NUMA node", "share_numa"),
            ("  sharing a PCIe root", "share_pcie"), ("  model: aligned (1.0)", "share_aligned"),
            ("  model: misaligned (0.71)", "share_misaligned"), ("  model: worst (0.40)", "share_worst"),
            ("modelled work done, GPU-hours (a model)", "modelled_work_gpu_hours"))
    for label, key in rows:
        before, after = _fmt(topology["unaligned"].get(key)), _fmt(topology["aligned"].get(key))
        lines.append(f"   {label:<44} {before:>10} {after:>10}")
    lines.append("")
    return lines


def render_versions(by_version: Mapping[str, Mapping[str, Any]]) -> str:
    """The scheduler figure of each Kubernetes version side by side (``BENCH_KUBE_VERSION=1.37,1.36``):
    CPU per placed pod and pods bound per second, per fleet and layout."""
    versions = list(by_version)
    rows: dict[tuple[str, str, str], dict[str, Mapping[str, Any]]] = {}
    for version, results in by_version.items():
        scheduler = (results.get("figures") or {}).get("scheduler") or {}
        for view in ("same_fleet", "same_pods"):
            for row in scheduler.get(view) or []:
                rows.setdefault((view, row["fleet"], row["layout"]), {})[version] = row
    if not rows:
        return "Scheduler by Kubernetes version: no scheduler figure was measured."
    head = "".join(f" {v + ' ms/pod':>16} {'pods/s':>7}" for v in versions)
    lines = ["Scheduler by Kubernetes version (kube-scheduler CPU per placed pod; pods bound per second)",
             f"   {'view':<10} {'fleet':<16} {'layout':<14}{head}"]
    for (view, fleet, layout), found in rows.items():
        cells = "".join(f" {found[v]['ms_per_pod']:>16.2f} {found[v]['pods_per_s']:>7.1f}" if v in found
                        else f" {'-':>16} {'-':>7}" for v in versions)
        lines.append(f"   {view:<10} {fleet:<16} {layout:<14}{cells}")
    return "\n".join(lines)
