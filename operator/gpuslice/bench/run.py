"""``make bench``: every figure in one run, against its targets, with the history kept in bench/."""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from gpuslice import __version__
from gpuslice.bench.harness import BenchCluster
from gpuslice.bench.report import headline, regressions, render_text, trim_history, verdicts
from gpuslice.bench.trace import TraceSpec

FIGURES = ("packing", "scheduler", "scale", "planner")


@dataclass(frozen=True)
class Size:
    """How big each figure runs; ``full`` is what results.json is compared on."""

    name: str
    fleet_sizes: tuple[int, ...]
    same_pods: int
    scale_nodes: int
    scale_policies: int
    scale_namespaces: int
    steady_seconds: float


SIZES = {
    "full": Size("full", (8, 100), 512, 1000, 50, 200, 300.0),
    "medium": Size("medium", (8, 24), 512, 300, 50, 200, 120.0),
    "small": Size("small", (2,), 64, 40, 10, 20, 30.0),
}


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    memory = next((int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal")), 0)
    return f"{os.cpu_count()} x {model}, {memory / 1024**2:.0f} GiB, {platform.system()} {platform.release()}"


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


async def measure(size: Size, only: tuple[str, ...], state_dir: Path) -> tuple[dict[str, Any], str]:
    figures: dict[str, Any] = {}
    kubernetes = ""
    if "planner" in only:
        from gpuslice.bench.planner_figure import planner_figure

        say("planner: timing the pure planner")
        figures["planner"] = planner_figure()
    if not {"packing", "scheduler", "scale"} & set(only):
        return figures, kubernetes
    cluster = BenchCluster(state_dir, say)
    try:
        await cluster.start()
        kubernetes = cluster.kubernetes_version
        await cluster.start_controller()
        if "packing" in only:
            from gpuslice.bench.packing_figure import packing_figure

            figures["packing"] = await packing_figure(cluster, TraceSpec(), say)
        if "scheduler" in only:
            from gpuslice.bench.scheduler_figure import scheduler_figure

            fleets = tuple(int(n) for n in os.environ.get("BENCH_FLEETS", "").split(",") if n) or size.fleet_sizes
            layouts = tuple(x for x in os.environ.get("BENCH_LAYOUTS", "").split(",") if x)
            profile = Path(os.environ["BENCH_PROFILE"]) if os.environ.get("BENCH_PROFILE") else None
            figures["scheduler"] = await scheduler_figure(
                cluster, fleets, int(os.environ.get("BENCH_SAME_PODS", size.same_pods)), say, layouts, profile)
        if "scale" in only:
            from gpuslice.bench.scale_figure import scale_figure

            # A controller started now has seen nothing of the figures before: its peak RSS is this figure's.
            await cluster.stop_controller()
            await cluster.start_controller()
            nodes, policies, namespaces, steady = (
                (int(x) for x in os.environ["BENCH_SCALE"].split(",")) if os.environ.get("BENCH_SCALE")
                else (size.scale_nodes, size.scale_policies, size.scale_namespaces, int(size.steady_seconds)))
            figures["scale"] = await scale_figure(cluster, nodes, policies, namespaces, float(steady), say)
    finally:
        await cluster.stop()
    return figures, kubernetes


def main() -> None:
    size = SIZES[os.environ.get("BENCH_SIZE", "full")]
    only = tuple(f for f in os.environ.get("BENCH_ONLY", ",".join(FIGURES)).split(",") if f)
    out = Path(os.environ.get("BENCH_DIR", "bench"))
    # The fleet harness runs hundreds of agents in this process: their warnings (a policy not judged
    # yet, a retried request) would drown the report.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    load_before = os.getloadavg()
    if size.name == "full" and load_before[0] > 1.5:
        say(f"warning: load average {load_before[0]:.1f} before the run: the machine is busy, figures will be off")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpuslice-bench-") as state:
        figures, kubernetes = asyncio.run(measure(size, only, Path(state)))
    elapsed = time.monotonic() - started
    if "scheduler" in figures:
        figures["scheduler"]["notes"] = [
            "claims are made before the pods; the agents publish each layout and stop before the pods come",
        ]
    import kopf

    results: dict[str, Any] = {
        "meta": {
            "when": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "size": size.name, "figures": list(only), "seconds": round(elapsed),
            "machine": machine(),
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
            "versions": f"Kubernetes {kubernetes or 'n/a'} (kube-scheduler, kube-apiserver from Go modules),"
                        f" gpuslice {__version__} @ {git_commit()}, Python {platform.python_version()},"
                        f" kopf {getattr(kopf, '__version__', '?')}",
        },
        "figures": figures,
    }
    results["verdicts"] = verdicts(figures)
    history_path = out / "history.json"
    history = json.loads(history_path.read_text()) if history_path.exists() else []
    flat = headline(figures)
    previous = next((h for h in reversed(history) if h.get("size") == size.name), None)
    results["regressions"] = regressions(flat, previous["figures"]) if previous else []
    out.mkdir(parents=True, exist_ok=True)
    (out / f"results{'' if size.name == 'full' else '-' + size.name}.json").write_text(json.dumps(results, indent=1))
    entry = {"when": results["meta"]["when"], "commit": git_commit(), "size": size.name, "figures": flat}
    history_path.write_text(json.dumps(trim_history(history, entry), indent=1))
    if "packing" in figures:
        from gpuslice.bench.plot import packing_plot

        plotted = packing_plot(figures["packing"], out / "packing.png")
        if plotted is None:
            say("no matplotlib: the packing plot was not drawn (pip install -e '.[bench]')")
    print(render_text(results))
    print(f"\nmake bench took {elapsed / 60:.1f} min ({size.name} size); results in {out}/")


if __name__ == "__main__":
    main()
