"""A figure that fails is reported as failed, with what it had measured, and the next one still runs."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from gpuslice.bench import planner_figure as planner_module
from gpuslice.bench import run
from gpuslice.bench.report import headline, latest, render_text, verdicts
from gpuslice.bench.scheduler_figure import summarize


def test_a_failed_figure_is_saved_with_its_error_and_the_run_goes_on(monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path: Path) -> None:
    def broken(*_: Any) -> dict[str, Any]:
        raise ConnectionError("Cannot connect to host 127.0.0.1:6443 [Too many open files]")

    monkeypatch.setattr(planner_module, "planner_figure", broken)
    saved: list[dict[str, Any]] = []
    figures, _ = asyncio.run(run.measure(run.SIZES["small"], ("planner",), tmp_path,
                                         lambda f, _k: saved.append(dict(f))))
    assert figures["planner"] == {"error": "ConnectionError: Cannot connect to host 127.0.0.1:6443 [Too many open"
                                           " files]", "post_mortem": ""}
    assert saved == [figures]


def test_the_report_names_a_failed_figure_and_keeps_what_it_measured() -> None:
    partial = {"nodes": 1000, "gpus_per_node": 8, "policies": 50, "namespaces": 200, "harness": "h",
               "converge_seconds": 91.5, "error": "BenchError: timed out"}
    results = run.assemble(run.SIZES["full"], ("scale",), {"scale": partial}, "v1.37.2", (0.1, 0.1, 0.1), 10.0,
                           True)
    assert results["failed"] == {"scale": "BenchError: timed out"}
    assert [v["met"] for v in results["verdicts"] if v["key"] == "scale.steady_writes"] == [None]
    text = render_text(results | {"regressions": []})
    assert "FAILED: scale: BenchError: timed out" in text
    assert "91.50" in text  # what it measured before failing is shown
    assert verdicts(results["figures"])[0]["met"] is None


def test_what_a_failed_figure_measured_is_never_judged_met() -> None:
    """The steady-state figures of a scale run that then failed (editing, tainting) are shown, not judged."""
    partial = {"nodes": 10, "gpus_per_node": 8, "policies": 2, "namespaces": 4, "harness": "h", "steady_writes": 0,
               "controller_peak_rss_mib": 120.0, "agent_peak_rss_mib": 70.0, "error": "BenchError: taint timed out"}
    found = {v["key"]: v for v in verdicts({"scale": partial})}
    assert found["scale.steady_writes"]["value"] == 0
    assert found["scale.steady_writes"]["met"] is None
    assert found["scale.steady_writes"]["failed"] is True
    text = render_text({"meta": {}, "figures": {"scale": partial}, "verdicts": list(found.values()),
                        "failed": {"scale": partial["error"]}})
    assert "FAILED        scale: API writes in steady state" in text
    assert "MET" not in text.replace("NOT MET", "")


def test_a_scheduler_run_without_its_whole_gpu_baseline_is_not_measured() -> None:
    """A layout's ratio needs whole GPUs on the same fleet: without them (that run failed) the
    figure is not measured, never a ratio of 0 that would read as met."""
    row = {"nodes": 8, "fleet": "8 nodes x 8", "layout": "memory-1", "title": "t", "pods": 512, "bound": 512,
           "devices": 64, "views": ["same_fleet", "same_pods"], "scheduler_cpu_s": 3.0, "ms_per_pod": 5.9,
           "create_s": 1.0, "bind_s": 2.0, "pods_per_s": 256.0}
    summary = summarize([row])
    assert summary["same_fleet"][0]["vs_whole"] is None
    assert summary["worst_ratio_same_fleet"] is None
    assert summary["worst_ratio_same_pods"] is None
    whole = {**row, "layout": "whole", "ms_per_pod": 5.0}
    assert summarize([row, whole])["worst_ratio_same_fleet"] == 1.18


def test_the_baseline_of_a_figure_is_its_last_run_that_measured_it() -> None:
    history = [{"size": "full", "figures": {"a": 1.0, "b": 2.0}}, {"size": "small", "figures": {"a": 9.0}},
               {"size": "full", "figures": {"b": 3.0}, "failed": ["a"]}]
    assert latest(history, "full") == {"a": 1.0, "b": 3.0}
    failed_figures = {"scale": {"converge_seconds": 1.0, "error": "x"}, "planner": {"validate_10k_gpus_ms": 5.0}}
    assert headline(failed_figures) == {"planner.validate_10k_gpus_ms": 5.0}


def test_each_kubernetes_version_is_measured_in_one_run_and_shown_side_by_side(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """BENCH_KUBE_VERSION=1.37,1.36: each figure on each version's control plane in turn; the first is
    the run's own (results.json, the history), the other's goes beside it and is compared with nothing."""
    seen: list[str] = []

    async def measure(size: run.Size, only: tuple[str, ...], state: Path, save: Any) -> tuple[dict[str, Any], str]:
        minor = run.os.environ[run.KUBE_VERSION_ENV]
        seen.append(minor)
        ms = 5.0 if minor == "1.37" else 40.0
        row = {"fleet": "8 nodes x 8", "layout": "memory", "pods": 64, "devices": 9, "ms_per_pod": ms,
               "pods_per_s": 1000 / ms, "vs_whole": 1.0, "views": ["same_fleet"]}
        return {"scheduler": {"same_fleet": [row], "same_pods": []}}, f"v{minor}.2"

    monkeypatch.setattr(run, "measure", measure)
    monkeypatch.setenv("BENCH_DIR", str(tmp_path))
    monkeypatch.setenv("BENCH_ONLY", "scheduler")
    monkeypatch.setenv("BENCH_SIZE", "small")
    monkeypatch.setenv("BENCH_KUBE_VERSION", "1.37, v1.36")
    monkeypatch.setenv(run.KUBE_VERSION_ENV, "")  # recorded, so the value run.main() sets is undone after
    monkeypatch.delenv(run.KUBE_VERSION_ENV)
    run.main()

    assert seen == ["1.37", "1.36"]
    assert {p.name for p in tmp_path.iterdir()} == {"results-small.json", "results-small-kube1.36.json",
                                                    "history.json"}
    history = run.json.loads((tmp_path / "history.json").read_text())
    assert [h["figures"] for h in history] == [{"scheduler.same_fleet.8 nodes x 8.memory.ms_per_pod": 5.0}]
    out = capsys.readouterr().out
    side = out[out.index("Scheduler by Kubernetes version"):]
    assert "1.37 ms/pod" in side
    assert "1.36 ms/pod" in side
    row = next(line for line in side.splitlines() if "same_fleet" in line).split()
    assert row[-4:] == ["5.00", "200.0", "40.00", "25.0"], "1.37's CPU per pod and pods/s, then 1.36's"


def test_an_unknown_size_is_refused_with_the_sizes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("BENCH_SIZE", "tiny")
    monkeypatch.setenv("BENCH_DIR", str(tmp_path))
    with pytest.raises(SystemExit) as refused:
        run.main()
    assert str(refused.value) == ("make bench: BENCH_SIZE='tiny' is not a size; the sizes are full, medium, small,"
                                  " smoke (bench/README.md)")
    assert list(tmp_path.iterdir()) == [], "nothing written"


def test_the_smoke_size_makes_every_figure_with_every_mode() -> None:
    """CI's size still has what makes each mode: a scale figure of five policies (memory, shared and
    dynamic MIG, every fifth) on as many nodes (a policy with no node would never be Ready)."""
    smoke = run.SIZES["smoke"]
    assert smoke.scale_policies >= 5
    assert smoke.scale_nodes >= smoke.scale_policies
    assert smoke.fleet_sizes
