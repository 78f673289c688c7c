"""The fragmentation figure's trace and its offline arithmetic."""

from __future__ import annotations

import itertools

from gpuslice.bench.churn import (
    ChurnSpec,
    FleetSample,
    GpuLoad,
    Held,
    blocked_with_room,
    churn_trace,
    fewest_evictions,
    usable,
    waiting_with_room,
)

G = 10**9
H100 = 81_559 * 2**20
SMALL, LARGE = Held("a/slice", 10 * G, 116), Held("b/slice", 20 * G, 233)  # as the planner publishes them


def gpu(*pods: Held, open: bool = True) -> GpuLoad:
    return GpuLoad(tuple(pods), H100, 1000, (("a/slice", 8), ("b/slice", 4)), open)


def test_the_trace_is_seeded_and_mixes_inference_and_whole_gpu_pods() -> None:
    spec = ChurnSpec(minutes=120)
    trace = churn_trace(spec)
    assert trace == churn_trace(spec)
    assert trace != churn_trace(ChurnSpec(minutes=120, seed=12))
    assert {a.kind for a in trace} == {"10", "20", "full"}
    assert all(a.at < spec.minutes for a in trace)
    assert [a.at for a in trace] == sorted(a.at for a in trace)


def test_the_fewest_evictions_free_the_emptiest_gpu_whose_pods_fit_elsewhere() -> None:
    loads = [gpu(SMALL, SMALL), gpu(LARGE, LARGE, LARGE, LARGE), gpu(*[SMALL] * 7), gpu(SMALL, LARGE)]
    assert fewest_evictions(loads) == 2
    full = [gpu(*[SMALL] * 8), gpu(*[LARGE] * 4), gpu(SMALL)]
    assert fewest_evictions(full) is None, "the one pod of GPU 2 has nowhere to go"
    assert fewest_evictions([gpu(SMALL), gpu()]) == 0
    assert fewest_evictions([gpu(), gpu(SMALL, open=False)]) == 0
    assert fewest_evictions([gpu(LARGE), gpu(*[SMALL] * 5, LARGE, LARGE)]) is None, "90G would not fit in 85.5"
    assert fewest_evictions([gpu(LARGE), gpu(*[LARGE] * 3), gpu(SMALL)]) == 1, "no fifth 20G slice; GPU 2 has room"


def test_the_fewest_evictions_agree_with_trying_every_assignment() -> None:
    loads = [gpu(SMALL, LARGE), gpu(LARGE, LARGE, SMALL), gpu(*[SMALL] * 6)]
    brute = None
    for index, target in enumerate(loads):
        others = [g for i, g in enumerate(loads) if i != index]
        for places in itertools.product(range(len(others)), repeat=len(target.pods)):
            held = [list(o.pods) for o in others]
            for pod, place in zip(target.pods, places, strict=True):
                held[place].append(pod)
            if all(sum(h.memory for h in hs) <= H100 and sum(h.compute for h in hs) <= 1000
                   and sum(h is SMALL for h in hs) <= 8 and sum(h is LARGE for h in hs) <= 4 for hs in held):
                brute = len(target.pods) if brute is None else min(brute, len(target.pods))
                break
    assert fewest_evictions(loads) == brute == 2


def test_waiting_counts_only_while_the_fleet_had_the_room() -> None:
    samples = [FleetSample(0.0, 1, 0, 100), FleetSample(1.0, 1, 0, 50), FleetSample(3.0, 1, 0, 90),
               FleetSample(4.0, 0, 0, 90), FleetSample(6.0, 0, 0, 0)]
    assert waiting_with_room(samples, 80) == 2.0


def test_a_pod_an_empty_gpu_can_take_waits_for_the_scheduler_not_for_room() -> None:
    assert blocked_with_room(FleetSample(0.0, 1, 1, 800), 80) == 0, "an empty GPU: no move shortens it"
    assert blocked_with_room(FleetSample(0.0, 3, 1, 800), 80) == 2
    assert blocked_with_room(FleetSample(0.0, 3, 0, 170), 80) == 2, "room for two GPUs' worth, not three"
    samples = [FleetSample(0.0, 2, 1, 200), FleetSample(2.0, 2, 2, 200), FleetSample(3.0, 0, 0, 0)]
    assert waiting_with_room(samples, 80) == 2.0


def test_room_is_free_memory_in_whole_slices_a_gpus_worth_in_the_fleet() -> None:
    assert usable(H100) == 80 * G, "an H100's last 5.5 GB holds no slice"
    assert usable(H100 - 35 * G) == 50 * G
    leftovers = 16 * usable(H100 - 8 * 10 * G)  # sixteen full GPUs' remainders: 88 GB free, none usable
    assert leftovers == 0
    samples = [FleetSample(0.0, 1, 0, leftovers), FleetSample(1.0, 1, 0, 70 * G), FleetSample(2.0, 1, 0, 80 * G),
               FleetSample(3.0, 0, 0, 0)]
    assert waiting_with_room(samples) == 1.0, "only with 8 free slices in the fleet can moves make room"
