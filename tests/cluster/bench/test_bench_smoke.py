"""`make bench` as CI's smoke test: every figure at the smoke size (`BENCH_SIZE=smoke`), on a control plane
of its own, completes and writes its results as bench/README.md says. The bench makes every mode and every
change of mode on the same GPUs (whole GPUs, static MIG, memory, shared, shared with maxMemory; dynamic MIG
in the scheduler and scale figures), so a product change that leaves a figure waiting fails here. No figure's
value is judged: the targets are for an idle machine at full size, and a shared CI machine is neither."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from gpuslice.bench.planner_figure import MODES as PLANNER_MODES
from gpuslice.bench.report import TARGETS
from gpuslice.bench.run import FIGURES

LIMIT = 1500  # seconds: the smoke takes a few minutes; a figure that waits for good fails before this


def run_bench(out: Path) -> subprocess.CompletedProcess[str]:
    """`make bench`'s command at the smoke size, its results in ``out``; on timeout its process group is
    stopped (its control plane's processes die with it)."""
    env = {**os.environ, "BENCH_SIZE": "smoke", "BENCH_DIR": str(out)}
    with subprocess.Popen([sys.executable, "-m", "gpuslice.bench"], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, start_new_session=True) as process:
        try:
            stdout, stderr = process.communicate(timeout=LIMIT)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                stdout, stderr = process.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                stdout, stderr = process.communicate()
            raise AssertionError(f"the smoke bench did not finish within {LIMIT} s:\n{stderr[-6000:]}") from None
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def test_every_figure_of_the_bench_completes_and_writes_its_results(tmp_path: Path) -> None:
    done = run_bench(tmp_path)
    assert done.returncode == 0, f"{done.stdout[-4000:]}\n{done.stderr[-8000:]}"
    assert "make bench took" in done.stdout, "the report was printed"

    results = json.loads((tmp_path / "results-smoke.json").read_text())
    meta = results["meta"]
    assert (meta["size"], meta["complete"], meta["figures"]) == ("smoke", True, list(FIGURES))
    assert results["failed"] == {}
    figures = results["figures"]
    assert set(figures) == set(FIGURES)
    assert not [name for name, figure in figures.items() if "error" in figure]

    packing = figures["packing"]["modes"]
    assert list(packing) == ["whole", "mig-static", "memory", "shared", "shared-limited"], \
        "every way, in the order that changes the GPUs' mode each time"
    assert all(mode["pods_placed"] > 0 for mode in packing.values()), "each published and served pods"

    scheduler = figures["scheduler"]["same_fleet"]
    assert {row["layout"] for row in scheduler} == {"whole", "memory-1", "memory-3", "shared", "mig-dynamic"}
    assert all(row["bound"] > 0 for row in scheduler)

    scale = figures["scale"]
    assert scale["devices"] > 0
    assert {"converge_requests", "steady_writes", "edit_requests"} <= set(scale)

    fragmentation = figures["fragmentation"]
    assert all(fragmentation[mode]["samples"] > 0 for mode in ("off", "auto"))

    assert set(figures["planner"]["plan_node_ms"]) == set(PLANNER_MODES)
    assert len(results["verdicts"]) == len(TARGETS), "every target has its verdict (met, not met or not measured)"

    history = json.loads((tmp_path / "history.json").read_text())
    assert [(entry["size"], entry["failed"]) for entry in history] == [("smoke", [])]
