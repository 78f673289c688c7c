"""The fragmentation figure's trace and arithmetic (pure): a seeded churn of inference pods and
whole-GPU pods, and the offline count of the fewest evictions a move could have made.

Inference pods arrive as a Poisson process and live an exponential time, each asking for one
10G or one 20G slice (two memory policies sharing every GPU, as the packing figure's ladder does);
whole-GPU pods arrive now and then and live longer. Time is in simulated minutes; the figure
replays it faster than real time (``ChurnSpec.seconds_per_minute``).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ChurnSpec:
    seed: int = 11
    minutes: float = 240.0  # simulated
    gpus: int = 16
    inference_per_minute: float = 0.9
    inference_life: float = 60.0  # mean, minutes
    small_share: float = 0.7  # of inference pods, the 10G ones (the rest 20G)
    prefill: int = 54  # inference pods running at minute 0 (the steady state: rate x life)
    large_every: float = 8.0  # mean minutes between whole-GPU pods
    large_life: float = 30.0
    seconds_per_minute: float = 2.0  # the replay's speed: real seconds per simulated minute


@dataclass(frozen=True)
class Arrival:
    name: str
    kind: str  # "10", "20" (GB slice) or "full"
    at: float  # minutes
    life: float

    @property
    def until(self) -> float:
        return self.at + self.life


def churn_trace(spec: ChurnSpec) -> list[Arrival]:
    rng = random.Random(spec.seed)
    found: list[Arrival] = []
    for _i in range(spec.prefill):
        found.append(Arrival(f"inf-{len(found):04d}", "10" if rng.random() < spec.small_share else "20", 0.0,
                             rng.expovariate(1 / spec.inference_life)))
    t = 0.0
    while True:
        t += rng.expovariate(spec.inference_per_minute)
        if t >= spec.minutes:
            break
        found.append(Arrival(f"inf-{len(found):04d}", "10" if rng.random() < spec.small_share else "20", t,
                             rng.expovariate(1 / spec.inference_life)))
    t, k = 0.0, 0
    while True:
        t += rng.expovariate(1 / spec.large_every)
        if t >= spec.minutes * 0.8:  # the last fifth lets the last ones be placed
            break
        found.append(Arrival(f"big-{k:03d}", "full", t, rng.expovariate(1 / spec.large_life) + 10))
        k += 1
    return sorted(found, key=lambda a: (a.at, a.name))


@dataclass(frozen=True)
class Held:
    """A device a pod holds: its kind (policy and kind, e.g. ``p-10g/slice``) and what it consumes of
    its GPU's counters, as the scheduler counts them."""

    kind: str
    memory: int
    compute: int


@dataclass(frozen=True)
class GpuLoad:
    """One GPU when a move was planned: the devices its inference pods hold, its counters, how many
    devices of each kind it publishes, and whether it can take moved pods (it holds no whole-GPU pod
    and is not being freed)."""

    pods: tuple[Held, ...]
    memory: int
    compute: int
    slots: tuple[tuple[str, int], ...] = ()
    open: bool = True


def _fits(pods: Sequence[Held], gpus: Sequence[GpuLoad], placed: list[list[Held]]) -> bool:
    """Whether every pod finds a device of its kind on some GPU (``placed[i]``: what GPU i holds
    then), with the GPU's memory and compute counters not exceeded: exact, by backtracking."""
    if not pods:
        return True
    pod, rest = pods[0], pods[1:]
    tried: set[tuple[int, tuple[Held, ...]]] = set()
    for index, gpu in enumerate(gpus):
        held = placed[index]
        key = (id(gpu.slots), tuple(sorted(held, key=lambda h: (h.kind, h.memory))))
        if key in tried:
            continue
        tried.add(key)
        if (sum(h.memory for h in held) + pod.memory <= gpu.memory
                and sum(h.compute for h in held) + pod.compute <= gpu.compute
                and sum(h.kind == pod.kind for h in held) < dict(gpu.slots).get(pod.kind, 0)):
            held.append(pod)
            ok = _fits(rest, gpus, placed)
            held.pop()
            if ok:
                return True
    return False


def fewest_evictions(gpus: Sequence[GpuLoad]) -> int | None:
    """The fewest pods to evict so that one GPU is empty for a whole-GPU pod and every evicted pod
    has a device of its kind elsewhere: trying every GPU (a whole GPU needs every pod on it gone)
    and every placement of its pods on the others."""
    best: int | None = None
    for index, gpu in enumerate(gpus):
        if not gpu.open or (best is not None and len(gpu.pods) >= best):
            continue
        others = [g for i, g in enumerate(gpus) if i != index and g.open]
        if _fits(sorted(gpu.pods, key=lambda h: (-h.memory, h.kind)), others, [list(g.pods) for g in others]):
            best = len(gpu.pods)
    return best


SLICE = 10**10  # the smallest slice of the figure's policies
ROOM = 8 * SLICE  # what a GPU's slices hold: free slices worth that much can take any GPU's pods


def usable(free: int) -> int:
    """Free memory of one GPU that a slice can use: whole 10G slices (an H100's last 5.5 GB, which
    no slice fits, is no room for a moved pod)."""
    return free // SLICE * SLICE


@dataclass(frozen=True)
class FleetSample:
    """The fleet at one sample: the whole-GPU pods waiting, the GPUs with nothing allocated (a
    waiting whole-GPU pod can have one without any move), and the usable free memory of the others."""

    minute: float
    waiting: int
    empty_gpus: int
    free_elsewhere: int  # usable free bytes on GPUs that hold something


def blocked_with_room(sample: FleetSample, need: int = ROOM) -> int:
    """Waiting whole-GPU pods that no empty GPU can take (the others wait for the scheduler, which
    no move shortens) and for which the fleet's scattered free slices could make room: at most one
    per GPU's worth (``need``) of them."""
    return min(max(0, sample.waiting - sample.empty_gpus), sample.free_elsewhere // need)


def waiting_with_room(samples: Sequence[FleetSample], need: int = ROOM) -> float:
    """Pod-minutes whole-GPU pods waited for want of an empty GPU while the fleet's free slices
    elsewhere came to a GPU's worth per pod: ``samples`` in order, each counting until the next.
    This is what moving pods can shorten."""
    return sum(blocked_with_room(s, need) * (after.minute - s.minute) for s, after in itertools.pairwise(samples))


def waiting_at_all(samples: Sequence[FleetSample]) -> float:
    """Pod-minutes whole-GPU pods waited, for whatever reason (the scheduler's own delay included)."""
    return sum(s.waiting * (after.minute - s.minute) for s, after in itertools.pairwise(samples))
