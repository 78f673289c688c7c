"""The offline optimum is exact: checked against brute force on small traces."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslice.bench.packing import optimal_packing
from gpuslice.bench.trace import TraceSpec, inference_trace


def brute_force(items: list[int], bins: int, capacity: int) -> int:
    best = 0
    for assignment in itertools.product(range(bins + 1), repeat=len(items)):  # bins == "left out"
        loads = [0] * bins
        for item, where in zip(items, assignment, strict=True):
            if where < bins:
                loads[where] += item
        if all(load <= capacity for load in loads):
            best = max(best, sum(loads))
    return best


@settings(max_examples=150, deadline=None)
@given(items=st.lists(st.integers(1, 12), min_size=1, max_size=7), bins=st.integers(1, 3),
       capacity=st.integers(5, 15))
def test_optimum_equals_brute_force(items: list[int], bins: int, capacity: int) -> None:
    packing = optimal_packing(items, bins, capacity)
    assert packing.proven
    assert packing.value == brute_force(items, bins, capacity)
    assert packing.value == sum(sum(b) for b in packing.bins)
    assert all(sum(b) <= capacity for b in packing.bins)
    remaining = list(items)
    for item in (i for b in packing.bins for i in b):
        remaining.remove(item)  # every packed item is one of the trace's, used once


def test_a_known_instance() -> None:
    assert optimal_packing([7, 7, 5, 3, 3, 2], 2, 10).value == 20  # 7+3 and 7+3 (or 5+3+2)
    assert optimal_packing([6, 6, 6], 2, 10).value == 12


def test_the_default_trace_is_proven_and_fills_its_gpus() -> None:
    trace = inference_trace(TraceSpec())
    packing = optimal_packing(trace, 16, 79)
    assert packing.proven
    assert packing.value == 16 * 79  # the trace asks more than 16 GPUs hold; they can be filled to the GiB


def test_an_unfinished_search_says_so_and_gives_a_bound() -> None:
    items = [13, 11, 9, 7, 5, 3] * 5
    packing = optimal_packing(items, 4, 29, node_limit=5)
    assert packing.bound >= packing.value
    if not packing.proven:
        assert packing.bound == min(sum(items), 4 * 29)


def test_items_larger_than_a_bin_are_left_out() -> None:
    assert optimal_packing([50, 3], 1, 10).value == 3
