"""A seeded trace of inference pods and the GPU memory each one needs.

Needs are whole GiB between 5 and 40, log-normally distributed around a median of
13 GiB: many small models and embedders (5 to 10 GiB), a bulk of 7B-8B models in
fp16 (14 to 20 GiB), fewer 13B models (24 to 32 GiB) and a tail of quantized 34B-70B
models (35 to 40 GiB). The same seed gives the same trace on every machine.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

GIB = 1024**3


@dataclass(frozen=True)
class TraceSpec:
    seed: int = 15
    pods: int = 120
    median_gib: float = 13.0
    sigma: float = 0.6
    low_gib: int = 5
    high_gib: int = 40


def inference_trace(spec: TraceSpec = TraceSpec()) -> tuple[int, ...]:
    """The pods' memory needs in GiB, in arrival order."""
    rng = random.Random(spec.seed)
    return tuple(
        min(spec.high_gib, max(spec.low_gib, round(rng.lognormvariate(math.log(spec.median_gib), spec.sigma))))
        for _ in range(spec.pods)
    )
