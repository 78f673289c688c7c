"""How many devices of a kind a claim could get now, each mode by its own arithmetic
(planning.reads.availability over SlicingMode.room)."""

from __future__ import annotations

from gpuslice.planning.reads.availability import largest_free, on_gpu
from gpuslice.planning.reads.occupancy import GpuMap
from gpuslice.planning.reads.status_report import Snapshot
from tests.unit.planning.cluster_state import H100, INFERENCE, Body, claim, only_gpu, policy_body, published, tag, taint

G = 10**9
T = tag("n1")
A = tag("n1", "a100-40gb")
TRAINING = policy_body("training", {"mode": "mig", "mig": {"profiles": ["1g.5gb", "3g.20gb"]}})
NOTEBOOKS = policy_body("notebooks", {"mode": "shared", "sliceSize": "10G"})


def gpu(policy: Body, model: str, claims: list[Body], tainted: frozenset[str] = frozenset()) -> GpuMap:
    slices = published("n1", model, 1, [policy])
    taint(slices, set(tainted), "gpuslice.dev/unhealthy", "XID 79")
    return only_gpu(Snapshot([policy], slices, claims))


def test_memory_slices_count_the_memory_left_in_the_counter_set() -> None:
    held = [claim("a", f"c{i}", [("n1", f"{T}-inference-10g-{i}")]) for i in range(2)]
    found = on_gpu(gpu(INFERENCE, "h100-80gb", held), "inference", "slice")
    assert (found.free, found.kept_off) == ((H100 - 20 * G) // (10 * G), 0)
    # Counter room for six, but one idle slice is tainted: five a claim could get, one kept off.
    found = on_gpu(gpu(INFERENCE, "h100-80gb", held, frozenset({f"{T}-inference-10g-7"})), "inference", "slice")
    assert (found.free, found.kept_off) == (5, 1)
    assert found.reasons == ("unhealthy: XID 79",)


def test_a_whole_gpu_needs_every_slice_of_it_idle() -> None:
    assert on_gpu(gpu(INFERENCE, "h100-80gb", []), "inference", "full").free == 1
    held = [claim("a", "c0", [("n1", f"{T}-inference-10g-3")])]
    assert on_gpu(gpu(INFERENCE, "h100-80gb", held), "inference", "full").free == 0


def test_a_shared_device_takes_more_claims_while_its_capacity_lasts() -> None:
    t = tag("n1", "l4")
    held = [claim("a", "c0", [("n1", f"{t}-notebooks-shared")], consumed="10G")]
    busy = gpu(NOTEBOOKS, "l4", held)
    assert on_gpu(busy, "notebooks", "shared", 10 * G).free == 1  # allocated, and room for one more step
    assert on_gpu(busy, "notebooks", "shared", 20 * G).free == 0
    assert largest_free([busy], "notebooks") == (busy, "shared", busy.memory - 10 * G)


def test_mig_placements_count_those_a_claim_could_get_together() -> None:
    idle = gpu(TRAINING, "a100-40gb", [])
    assert on_gpu(idle, "training", "1g.5gb").free == 7  # seven 1g placements, none overlapping
    assert on_gpu(idle, "training", "3g.20gb").free == 2  # at 0 and at 4
    held = [claim("ml", "c", [("n1", f"{A}-mig-3g20gb-at-4")])]  # memory slices 4 to 7
    busy = gpu(TRAINING, "a100-40gb", held)
    assert on_gpu(busy, "training", "1g.5gb").free == 4
    assert on_gpu(busy, "training", "3g.20gb").free == 1


def test_a_media_engine_placement_counts_once_for_the_gpus_one_media_counter() -> None:
    media = policy_body("media", {"mode": "mig", "mig": {"profiles": ["1g.5gb+me", "1g.5gb"]}})
    idle = gpu(media, "a100-40gb", [])
    assert on_gpu(idle, "media", "1g.5gb").free == 7
    assert on_gpu(idle, "media", "1g.5gb+me").free == 1  # seven placements, but one media-engines counter
    tainted = gpu(media, "a100-40gb", [], frozenset({f"{A}-mig-1g5gb-me-at-{i}" for i in range(7)}))
    assert (on_gpu(tainted, "media", "1g.5gb+me").free, on_gpu(tainted, "media", "1g.5gb+me").kept_off) == (0, 1)
    held = [claim("ml", "c", [("n1", f"{A}-mig-1g5gb-me-at-0")])]
    busy = gpu(media, "a100-40gb", held)
    assert on_gpu(busy, "media", "1g.5gb+me").free == 0  # the counter is taken
    assert on_gpu(busy, "media", "1g.5gb").free == 6


def test_slices_of_two_policies_draw_on_one_counter_set() -> None:
    wide = policy_body("wide", {"mode": "memory", "sliceSize": "20G"}, created="2026-11-29T11:00:00Z")
    slices = published("n1", "h100-80gb", 1, [INFERENCE, wide])
    held = [claim("b", f"w{i}", [("n1", f"{T}-wide-20g-{i}")]) for i in range(2)]
    shared_gpu = only_gpu(Snapshot([INFERENCE, wide], slices, held))
    # All eight 10G slices are idle, but the counter set has room for four of them.
    assert on_gpu(shared_gpu, "inference", "slice").free == (H100 - 40 * G) // (10 * G) == 4
    taint(slices, {f"{T}-inference-10g-{i}" for i in range(6)}, "gpuslice.dev/unhealthy", "XID 79")
    found = on_gpu(only_gpu(Snapshot([INFERENCE, wide], slices, held)), "inference", "slice")
    assert (found.free, found.kept_off) == (2, 2)  # two free, and room for two of the six kept off
