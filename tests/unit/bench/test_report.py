"""Verdicts say plainly what is met; the history catches a regression."""

from __future__ import annotations

from gpuslice.bench.report import HISTORY_KEEP, headline, regressions, render_text, trim_history, verdicts


def _figures(shared_ratio: float, steady_writes: int) -> dict:  # type: ignore[type-arg]
    mode = {"title": "t", "pods_placed": 79, "pods_vs_whole": 4.9, "memory_used_gib": 1240.0,
            "memory_allocated_gib": 1240.0, "ratio_to_optimum": shared_ratio}
    return {
        "packing": {"gpus": 16, "gpu": "H100", "optimum_gib": 1264, "optimum_proven": True,
                    "trace": {"pods": 120, "total_gib": 1929}, "modes": {"shared": mode}},
        "scale": {"nodes": 10, "gpus_per_node": 8, "policies": 2, "namespaces": 4, "harness": "h",
                  "steady_writes": steady_writes, "controller_peak_rss_mib": 120.0},
    }


def test_verdicts_met_not_met_and_not_measured() -> None:
    found = {v["key"]: v["met"] for v in verdicts(_figures(0.981, 3))}
    assert found["packing.modes.shared.ratio_to_optimum"] is True
    assert found["scale.steady_writes"] is False
    assert found["scale.controller_peak_rss_mib"] is True
    assert found["scale.agent_peak_rss_mib"] is None  # not measured is not "met"


def test_a_worse_figure_is_a_regression_and_a_better_one_is_not() -> None:
    before = headline(_figures(0.98, 0))
    assert regressions(headline(_figures(0.80, 0)), before) == [
        "packing.modes.shared.ratio_to_optimum: 0.98 -> 0.8 (-18%)"]
    assert regressions(headline(_figures(0.99, 0)), before) == []


def test_history_keeps_the_last_runs() -> None:
    history = [{"n": i} for i in range(HISTORY_KEEP)]
    kept = trim_history(history, {"n": "new"})
    assert len(kept) == HISTORY_KEEP
    assert kept[-1] == {"n": "new"}
    assert kept[0] == {"n": 1}


def test_the_table_says_met_and_not_met_in_words() -> None:
    figures = _figures(0.981, 3)
    text = render_text({"meta": {"when": "now", "machine": "m", "versions": "v"}, "figures": figures,
                        "verdicts": verdicts(figures), "regressions": []})
    assert "MET" in text
    assert "NOT MET" in text
    assert "not measured" in text
    assert "98.1%" in text
