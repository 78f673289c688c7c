"""A figure that fails is reported as failed, with what it had measured, and the next one still runs."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from gpuslice.bench import planner_figure as planner_module
from gpuslice.bench import run
from gpuslice.bench.report import render_text, verdicts


def test_a_failed_figure_is_saved_with_its_error_and_the_run_goes_on(monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path: Path) -> None:
    def broken() -> dict[str, Any]:
        raise ConnectionError("Cannot connect to host 127.0.0.1:6443 [Too many open files]")

    monkeypatch.setattr(planner_module, "planner_figure", broken)
    saved: list[dict[str, Any]] = []
    figures, _ = asyncio.run(run.measure(run.SIZES["small"], ("planner",), tmp_path,
                                         lambda f, _k: saved.append(dict(f))))
    assert figures["planner"] == {"error": "ConnectionError: Cannot connect to host 127.0.0.1:6443 [Too many open"
                                           " files]"}
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
