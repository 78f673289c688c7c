"""The benchmarks' trace is reproducible and realistic."""

from __future__ import annotations

from gpuslice.bench.trace import TraceSpec, inference_trace


def test_trace_is_seeded_bounded_and_skewed() -> None:
    trace = inference_trace(TraceSpec(seed=7))
    assert trace == inference_trace(TraceSpec(seed=7))
    assert trace != inference_trace(TraceSpec(seed=8))
    assert all(5 <= need <= 40 for need in trace)
    small = sum(1 for need in trace if need <= 16)
    assert small > len(trace) / 2 > sum(1 for need in trace if need >= 30)  # most small, a tail of large
