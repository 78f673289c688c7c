"""The topology figure's trace, its throughput model and its arithmetic (pure).

A seeded trace of training jobs of 1, 2, 4 and 8 whole GPUs: they arrive as a Poisson process (and
some are running at minute 0, the steady state), each with work to do, in GPU-minutes at full speed.

**A model, not a measurement.** How fast a job runs depends on how its GPUs talk; the figure takes the
seed's factors (the mission's: misaligned allocations run at 71% of optimal, 40% at worst):

- ``aligned`` (1.0): one GPU, or GPUs that share an NVLink domain (GPU-to-GPU traffic over NVLink);
- ``misaligned`` (0.71): no shared NVLink domain, but one NUMA node (PCIe peer-to-peer within a socket);
- ``worst`` (0.40): neither (traffic crosses the CPUs' interconnect).

A job placed at minute ``s`` with factor ``f`` ends at ``s + work / f``: a misaligned job also holds its
GPUs longer, which the replay on the real scheduler then lives with.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from gpuslice.inventory.topology import Alignment

FACTORS = {"aligned": 1.0, "misaligned": 0.71, "worst": 0.40}


@dataclass(frozen=True)
class TrainingSpec:
    seed: int = 7
    minutes: float = 240.0  # simulated
    fleets: int = 2  # how many of each server (dgx-h100, pcie-l40s, h100-nvl): 24 GPUs each
    per_minute: float = 0.6  # arrivals
    sizes: tuple[tuple[int, float], ...] = ((1, 0.4), (2, 0.25), (4, 0.2), (8, 0.15))  # (GPUs, share)
    mean_work: float = 25.0  # minutes at full speed, exponential (at least 2)
    prefill: int = 8  # jobs running at minute 0
    seconds_per_minute: float = 1.0  # the replay's speed: real seconds per simulated minute


@dataclass(frozen=True)
class Job:
    name: str
    gpus: int
    at: float  # minutes
    work: float  # minutes at full speed


def training_trace(spec: TrainingSpec) -> list[Job]:
    rng = random.Random(spec.seed)
    sizes, weights = zip(*spec.sizes, strict=True)

    def job(at: float) -> Job:
        return Job(f"job-{len(found):04d}", rng.choices(sizes, weights)[0], at,
                   max(2.0, rng.expovariate(1 / spec.mean_work)))

    found: list[Job] = []
    for _ in range(spec.prefill):
        found.append(job(0.0))
    t = 0.0
    while True:
        t += rng.expovariate(spec.per_minute)
        if t >= spec.minutes * 0.75:  # the last quarter lets the last ones be placed
            break
        found.append(job(t))
    return found


def job_class(gpus: int, shared: Sequence[Alignment]) -> str:
    """``aligned``, ``misaligned`` or ``worst`` for a job on ``gpus`` GPUs sharing ``shared``."""
    if gpus < 2 or "NVLink" in shared:
        return "aligned"
    return "misaligned" if "NUMANode" in shared else "worst"


@dataclass(frozen=True)
class Outcome:
    """One job in one run: when it was placed (None: never, within the trace), and what its GPUs share."""

    job: Job
    placed: float | None = None
    shared: tuple[Alignment, ...] = ()

    @property
    def kind(self) -> str:
        return job_class(self.job.gpus, self.shared)

    @property
    def ends(self) -> float | None:
        return None if self.placed is None else self.placed + self.job.work / FACTORS[self.kind]


def done_by(outcome: Outcome, end: float) -> float:
    """The job's work done by minute ``end``, in GPU-minutes at full speed (the model)."""
    if outcome.placed is None or outcome.placed >= end:
        return 0.0
    return outcome.job.gpus * min(outcome.job.work, (end - outcome.placed) * FACTORS[outcome.kind])


def summarize(outcomes: Sequence[Outcome], end: float) -> dict[str, object]:
    """One run's figures: jobs placed, waits, the share of placed multi-GPU jobs aligned at each level and
    in each class of the model, and the modelled work done."""
    placed = [o for o in outcomes if o.placed is not None]
    multi = [o for o in placed if o.job.gpus >= 2]
    waits = [o.placed - o.job.at for o in placed if o.placed is not None]
    waited = [end - o.job.at for o in outcomes if o.placed is None]

    def share(predicate: object) -> float | None:
        assert callable(predicate)
        return round(sum(1 for o in multi if predicate(o)) / len(multi), 4) if multi else None

    by_size = {}
    for size in sorted({o.job.gpus for o in outcomes}):
        mine = [o for o in outcomes if o.job.gpus == size]
        done = [o for o in mine if o.placed is not None]
        by_size[str(size)] = {"jobs": len(mine), "placed": len(done),
                              "mean_wait_min": round(statistics.fmean([o.placed - o.job.at for o in done
                                                                       if o.placed is not None]), 2) if done else None}
    work = sum(done_by(o, end) for o in outcomes)
    asked = sum(o.job.gpus * o.job.work for o in outcomes)
    return {
        "jobs": len(outcomes), "placed": len(placed), "multi_gpu_placed": len(multi),
        "mean_wait_min": round(statistics.fmean(waits), 2) if waits else None,
        "p95_wait_min": round(sorted(waits)[int(0.95 * (len(waits) - 1))], 2) if waits else None,
        "unplaced_waited_min": round(sum(waited), 1),
        "share_nvlink": share(lambda o: "NVLink" in o.shared), "share_numa": share(lambda o: "NUMANode" in o.shared),
        "share_pcie": share(lambda o: "PCIeRoot" in o.shared),
        "share_aligned": share(lambda o: o.kind == "aligned"),
        "share_misaligned": share(lambda o: o.kind == "misaligned"),
        "share_worst": share(lambda o: o.kind == "worst"),
        "by_size": by_size,
        "modelled_work_gpu_hours": round(work / 60, 2), "asked_work_gpu_hours": round(asked / 60, 2),
    }
