"""Each way of serving maps a need to the request the README says."""

from __future__ import annotations

from gpuslice.bench.layouts import GIB, H100, cost_layouts, packing_layouts


def _layout(name: str):  # type: ignore[no-untyped-def]
    return next(layout for layout in packing_layouts(["team"]) if layout.name == name)


def test_memory_mode_asks_the_smallest_class_first_then_larger() -> None:
    claim = _layout("memory").claim("team", "c", 12)
    assert claim is not None
    subrequests = claim["spec"]["devices"]["requests"][0]["firstAvailable"]
    assert [s["selectors"][0]["cel"]["expression"].split("== ")[1] for s in subrequests] == ['"20Gi"', '"40Gi"']
    assert all(s["count"] == 1 for s in subrequests)


def test_mig_asks_the_smallest_profile_that_holds_the_need() -> None:
    layout = _layout("mig-static")
    assert [c.gives for c in layout.choices(9)] == [9984 * 1024**2, 20096 * 1024**2, 40448 * 1024**2]
    assert [c.gives for c in layout.choices(10)] == [20096 * 1024**2, 40448 * 1024**2]  # 1g.10gb is 9.75 GiB
    assert layout.choices(41) == ()


def test_shared_rounds_up_to_the_step() -> None:
    layout = _layout("shared")
    claim = layout.claim("team", "c", 13)
    assert claim is not None
    assert claim["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"]["memory"] == str(13 * GIB)
    assert layout.choices(80) == ()  # more than the H100's 81,559 MiB


def test_whole_gpu_gives_a_whole_gpu_to_any_pod() -> None:
    layout = _layout("whole")
    assert layout.whole_gpu
    assert [c.gives for c in layout.choices(5)] == [H100.memory]


def test_cost_layouts_hold_the_claims_they_say() -> None:
    capacity = {layout.name: layout.capacity_per_gpu for layout in cost_layouts(["team"])}
    assert capacity == {"whole": 1, "memory-1": 8, "memory-3": 8, "shared": 8, "mig-dynamic": 7}
