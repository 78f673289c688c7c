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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from gpuslice import __version__
from gpuslice.bench.harness import BenchCluster, BenchPartial
from gpuslice.bench.report import (
    headline,
    latest,
    regressions,
    render_text,
    render_versions,
    trim_history,
    verdicts,
)
from gpuslice.bench.trace import TraceSpec
from gpuslice.devcluster.binaries import KUBE_VERSION_ENV

FIGURES = ("packing", "fragmentation", "scheduler", "scale", "planner", "topology")


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
    churn_minutes: float  # the fragmentation figure's trace, in simulated minutes (each run)
    topology_minutes: float = 240.0  # the topology figure's trace, in simulated minutes (each run)
    topology_fleets: int = 2  # of each server layout (bench.topology_figure)
    trace_pods: int = 120  # the packing figure's trace (its first pods, as seeded)
    churn_prefill: int = 54  # the fragmentation figure's inference pods at minute 0
    planner_gpus: int = 10_000  # the planner figure's fleet, and how often each plan is timed
    planner_repeat: int = 20


SIZES = {
    "full": Size("full", (8, 100), 512, 1000, 50, 200, 300.0, 240.0),
    "medium": Size("medium", (8, 24), 512, 300, 50, 200, 120.0, 180.0, topology_minutes=120.0),
    "small": Size("small", (2,), 64, 40, 10, 20, 30.0, 120.0, topology_minutes=40.0, topology_fleets=1),
    # CI's: every figure, every mode and every change of mode the bench makes, on the fewest pods and
    # nodes that still make them (five policies: the scale figure's memory, shared and dynamic MIG). Its
    # figures are not judged by anyone; that each one completes is (tests/cluster/bench).
    "smoke": Size("smoke", (1,), 0, 5, 5, 5, 5.0, 10.0, topology_minutes=10.0, topology_fleets=1, trace_pods=24,
                  churn_prefill=8, planner_gpus=800, planner_repeat=2),
}


def training_spec(size: Size) -> Any:
    """The topology figure's trace at ``size``: the arrival rate and the jobs running at the start grow with the
    fleet, so the load stays near the fleet's capacity (``bench.training``)."""
    from gpuslice.bench.training import TrainingSpec

    minutes = float(os.environ.get("BENCH_TOPOLOGY_MINUTES", size.topology_minutes))
    return TrainingSpec(minutes=minutes, fleets=size.topology_fleets, per_minute=0.3 * size.topology_fleets,
                        prefill=4 * size.topology_fleets)


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


def failure(error: BaseException) -> str:
    """One line for results.json: the exception's type and message (aiohttp's include the OS error)."""
    return f"{type(error).__name__}: {error}"[:2000]


async def measure(size: Size, only: tuple[str, ...], state_dir: Path,
                  save: Callable[[dict[str, Any], str], None]) -> tuple[dict[str, Any], str]:
    """Each figure in turn. A figure that fails is recorded as ``{"error": ...}`` (with what it had
    measured, where it keeps that) and the next one still runs; ``save`` is called after each, so a
    run stopped later keeps what it measured."""
    figures: dict[str, Any] = {}
    kubernetes = ""

    cluster: BenchCluster | None = None

    async def figure(name: str, run: Callable[[], Awaitable[dict[str, Any]]]) -> None:
        try:
            figures[name] = await run()
        except BenchPartial as partial:
            figures[name] = {**partial.measured, "error": failure(partial.error), "post_mortem": partial.post_mortem}
        except Exception as error:  # any failure is this figure's, reported; the next figure runs
            figures[name] = {"error": failure(error), "post_mortem": cluster.post_mortem() if cluster else ""}
        save(figures, kubernetes)
        if "error" in figures[name]:
            say(f"{name}: FAILED: {figures[name]['error']}\n{figures[name]['post_mortem']}")
            later = [f for f in ("packing", "fragmentation", "scheduler", "scale", "topology")
                     if f in only and f not in figures]
            if cluster is not None and later:
                try:
                    await cluster.reset()
                except Exception as error:  # the next figures will say what is wrong with the cluster
                    say(f"{name}: cleaning up after it failed: {failure(error)}")

    if "planner" in only:
        from gpuslice.bench.planner_figure import planner_figure

        async def planner() -> dict[str, Any]:
            say("planner: timing the pure planner")
            return planner_figure(size.planner_gpus, size.planner_repeat)

        await figure("planner", planner)
    if not {"packing", "fragmentation", "scheduler", "scale", "topology"} & set(only):
        return figures, kubernetes
    cluster = BenchCluster(state_dir, say)
    try:
        await cluster.start()
        kubernetes = cluster.kubernetes_version
        await cluster.start_controller()
        if "packing" in only:
            from gpuslice.bench.packing_figure import packing_figure

            await figure("packing", lambda: packing_figure(cluster, TraceSpec(pods=size.trace_pods), say))
        if "fragmentation" in only:
            from gpuslice.bench.churn import ChurnSpec
            from gpuslice.bench.fragmentation_figure import fragmentation_figure

            churn = ChurnSpec(minutes=float(os.environ.get("BENCH_CHURN_MINUTES", size.churn_minutes)),
                              prefill=size.churn_prefill)
            await figure("fragmentation", lambda: fragmentation_figure(cluster, churn, say))
        if "topology" in only:
            from gpuslice.bench.topology_figure import topology_figure

            await figure("topology", lambda: topology_figure(cluster, training_spec(size), say))
        if "scheduler" in only:
            from gpuslice.bench.scheduler_figure import scheduler_figure

            fleets = tuple(int(n) for n in os.environ.get("BENCH_FLEETS", "").split(",") if n) or size.fleet_sizes
            layouts = tuple(x for x in os.environ.get("BENCH_LAYOUTS", "").split(",") if x)
            profile = Path(os.environ["BENCH_PROFILE"]) if os.environ.get("BENCH_PROFILE") else None
            same_pods = int(os.environ.get("BENCH_SAME_PODS", size.same_pods))
            await figure("scheduler", lambda: scheduler_figure(cluster, fleets, same_pods, say, layouts, profile))
        if "scale" in only:
            from gpuslice.bench.scale_figure import scale_figure

            nodes, policies, namespaces, steady = (
                (int(x) for x in os.environ["BENCH_SCALE"].split(",")) if os.environ.get("BENCH_SCALE")
                else (size.scale_nodes, size.scale_policies, size.scale_namespaces, int(size.steady_seconds)))

            async def scale() -> dict[str, Any]:
                # A controller started now has seen nothing of the figures before: its peak RSS is this figure's.
                await cluster.stop_controller()
                await cluster.start_controller()
                return await scale_figure(cluster, nodes, policies, namespaces, float(steady), say)

            await figure("scale", scale)
    finally:
        await cluster.stop()
    return figures, kubernetes


def assemble(size: Size, only: tuple[str, ...], figures: dict[str, Any], kubernetes: str,
             load_before: tuple[float, float, float], elapsed: float, complete: bool) -> dict[str, Any]:
    """results.json: the figures, their verdicts and how and where they were taken."""
    import kopf

    if isinstance(figures.get("scheduler"), dict):
        figures["scheduler"]["notes"] = [
            "claims are made before the pods; the agents publish each layout and stop before the pods come",
        ]
    results: dict[str, Any] = {
        "meta": {
            "when": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "size": size.name, "figures": list(only), "seconds": round(elapsed), "complete": complete,
            "machine": machine(),
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
            "versions": f"Kubernetes {kubernetes or 'n/a'} (kube-scheduler, kube-apiserver from Go modules),"
                        f" gpuslice {__version__} @ {git_commit()}, Python {platform.python_version()},"
                        f" kopf {getattr(kopf, '__version__', '?')}",
        },
        "figures": figures,
        "failed": {name: f["error"] for name, f in figures.items() if isinstance(f, dict) and "error" in f},
    }
    results["verdicts"] = verdicts(figures)
    return results


def kube_versions() -> list[str]:
    """``BENCH_KUBE_VERSION``: the Kubernetes minors to measure on, one after another in this run
    (``1.37,1.36``); none: hack/kube's default. The first is the run's own (results.json and the
    history); each other's figures go to results-kube<minor>.json beside it, compared with nothing."""
    return [v.strip().removeprefix("v") for v in os.environ.get("BENCH_KUBE_VERSION", "").split(",") if v.strip()]


def main() -> None:
    name = os.environ.get("BENCH_SIZE", "full")
    if name not in SIZES:
        sys.exit(f"make bench: BENCH_SIZE={name!r} is not a size; the sizes are {', '.join(SIZES)} (bench/README.md)")
    size = SIZES[name]
    only = tuple(f for f in os.environ.get("BENCH_ONLY", ",".join(FIGURES)).split(",") if f)
    out = Path(os.environ.get("BENCH_DIR", "bench"))
    # The fleet harness runs hundreds of agents in this process: their warnings (a policy not judged
    # yet, a retried request) would drown the report.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    versions = kube_versions() or [""]
    started = time.monotonic()
    by_version: dict[str, dict[str, Any]] = {}
    failed: list[str] = []
    for index, version in enumerate(versions):
        if version:
            os.environ[KUBE_VERSION_ENV] = version  # devcluster.binaries picks that minor's build
        name = "" if index == 0 else f"-kube{version}"
        results = run_once(size, only, out, name, history=index == 0)
        by_version[version or results["meta"]["kubernetes"]] = results
        failed += [f"{f} (Kubernetes {version})" if version else f for f in results["failed"]]
    elapsed = time.monotonic() - started
    if len(by_version) > 1:
        print(render_versions(by_version))
    print(f"\nmake bench took {elapsed / 60:.1f} min ({size.name} size); results in {out}/")
    if failed:
        sys.exit(f"make bench: {', '.join(failed)} failed (see above; what was measured is in {out}/)")


def run_once(size: Size, only: tuple[str, ...], out: Path, name: str, history: bool) -> dict[str, Any]:
    """Every figure of ``only`` on one control plane; results{-size}{name}.json, and the history."""
    results_path = out / f"results{'' if size.name == 'full' else '-' + size.name}{name}.json"
    load_before = os.getloadavg()
    if size.name == "full" and load_before[0] > 1.5:
        say(f"warning: load average {load_before[0]:.1f} before the run: the machine is busy, figures will be off")
    started = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)

    def save(figures: dict[str, Any], kubernetes: str) -> None:
        """What is measured so far, marked incomplete: a run stopped later still leaves it."""
        partial = assemble(size, only, figures, kubernetes, load_before, time.monotonic() - started, False)
        results_path.write_text(json.dumps(partial, indent=1))

    with tempfile.TemporaryDirectory(prefix="gpuslice-bench-") as state:
        figures, kubernetes = asyncio.run(measure(size, only, Path(state), save))
    elapsed = time.monotonic() - started
    results = assemble(size, only, figures, kubernetes, load_before, elapsed, True)
    results["meta"]["kubernetes"] = kubernetes
    flat = headline(figures)
    if history:
        history_path = out / "history.json"
        runs = json.loads(history_path.read_text()) if history_path.exists() else []
        results["regressions"] = regressions(flat, latest(runs, size.name))
        entry = {"when": results["meta"]["when"], "commit": git_commit(), "size": size.name, "figures": flat,
                 "failed": sorted(results["failed"])}
        history_path.write_text(json.dumps(trim_history(runs, entry), indent=1))
    results_path.write_text(json.dumps(results, indent=1))
    if history and "modes" in (figures.get("packing") or {}):
        from gpuslice.bench.plot import packing_plot

        suffix = "" if size.name == "full" else f"-{size.name}"  # a smaller run never overwrites the full size's
        plotted = packing_plot(figures["packing"], out / f"packing{suffix}.png")
        if plotted is None:
            say("no matplotlib: the packing plot was not drawn (pip install -e '.[bench]')")
    print(render_text(results))
    return results


if __name__ == "__main__":
    main()
