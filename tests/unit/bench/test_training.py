"""The topology figure's trace, model and arithmetic (bench.training), and its place in the report."""

from __future__ import annotations

from gpuslice.bench.report import render_text, verdicts
from gpuslice.bench.training import FACTORS, Job, Outcome, TrainingSpec, done_by, job_class, summarize, training_trace


def test_the_trace_is_seeded_and_has_every_size() -> None:
    spec = TrainingSpec(minutes=240, per_minute=0.6, prefill=8)
    trace = training_trace(spec)
    assert trace == training_trace(spec), "the same seed, the same jobs"
    assert trace != training_trace(TrainingSpec(seed=8, minutes=240, per_minute=0.6, prefill=8))
    assert {j.gpus for j in trace} == {1, 2, 4, 8}
    assert sum(1 for j in trace if j.at == 0) == 8
    assert all(j.at < 240 * 0.75 and j.work >= 2 for j in trace)


def test_the_model_classes_a_job_by_what_its_gpus_share() -> None:
    assert job_class(1, ()) == "aligned", "one GPU talks to no other"
    assert job_class(4, ("NVLink",)) == "aligned"
    assert job_class(4, ("NUMANode", "PCIeRoot")) == "misaligned"
    assert job_class(8, ()) == "worst"
    assert FACTORS == {"aligned": 1.0, "misaligned": 0.71, "worst": 0.40}


def test_a_slower_job_does_less_work_by_the_end_and_ends_later() -> None:
    job = Job("j", 4, at=0.0, work=10.0)
    fast, slow = Outcome(job, 5.0, ("NVLink",)), Outcome(job, 5.0, ())
    assert (fast.ends, round(slow.ends or 0, 2)) == (15.0, 30.0)
    assert done_by(fast, 20.0) == 40.0, "all of it: 4 GPUs x 10 minutes"
    assert done_by(slow, 15.0) == 4 * 10 * 0.40
    assert done_by(Outcome(job), 100.0) == 0.0, "never placed"


def test_a_run_is_summed_up_by_size_share_and_work() -> None:
    jobs = [Job("a", 1, 0, 10), Job("b", 4, 0, 10), Job("c", 4, 2, 10), Job("d", 8, 5, 10)]
    outcomes = [Outcome(jobs[0], 0.0), Outcome(jobs[1], 1.0, ("NVLink", "NUMANode")),
                Outcome(jobs[2], 4.0, ("NUMANode",)), Outcome(jobs[3])]
    found = summarize(outcomes, 20.0)
    assert (found["jobs"], found["placed"], found["multi_gpu_placed"]) == (4, 3, 2)
    assert found["share_nvlink"] == 0.5
    assert (found["share_aligned"], found["share_misaligned"], found["share_worst"]) == (0.5, 0.5, 0.0)
    assert found["mean_wait_min"] == 1.0
    assert found["unplaced_waited_min"] == 15.0
    assert found["by_size"]["8"] == {"jobs": 1, "placed": 0, "mean_wait_min": None}


def test_the_figure_has_verdicts_and_a_table() -> None:
    run = {"placed": 10, "mean_wait_min": 1.0, "p95_wait_min": 3.0, "share_nvlink": 0.5, "share_numa": 0.7,
           "share_pcie": 0.1, "share_aligned": 0.5, "share_misaligned": 0.3, "share_worst": 0.2,
           "modelled_work_gpu_hours": 10.0}
    figures = {"topology": {"spec": {"jobs": 12, "gpus": 24, "fleet": {"dgx-h100": 1}, "minutes": 40.0},
                            "unaligned": run, "aligned": {**run, "share_worst": 0.0, "share_aligned": 0.8},
                            "aligned_share_vs_unaligned": 1.6, "modelled_work_ratio": 1.1}}
    found = {v["key"]: v["met"] for v in verdicts(figures) if v["key"].startswith("topology")}
    assert found == {"topology.aligned.share_worst": True, "topology.aligned_share_vs_unaligned": True,
                     "topology.modelled_work_ratio": True}
    text = render_text({"meta": {}, "figures": figures, "verdicts": verdicts(figures)})
    assert "6. Topology: 12 training jobs" in text
    assert "modelled work done, GPU-hours (a model)" in text
