"""Devices per policy and who holds them."""

from __future__ import annotations

from gpuslice.planning.cluster_objects import DeviceRef
from gpuslice.planning.usage import ClaimView, SliceView, devices_by_policy, usage


def slice_spec(pool: str, generation: int, devices: dict[str, str]) -> dict[str, object]:
    return {"driver": "gpu.gpuslice.dev", "pool": {"name": pool, "generation": generation, "resourceSliceCount": 1},
            "devices": [{"name": d, "attributes": {"gpuslice.dev/policy": {"string": p}}} for d, p in devices.items()]}


def test_an_incomplete_pool_counts_nothing() -> None:
    spec = slice_spec("n1", 3, {"d0": "a"})
    spec["pool"]["resourceSliceCount"] = 2  # the other slice of generation 3 is not written yet
    assert devices_by_policy([SliceView.from_slice(spec)]) == {}


def test_only_the_newest_generation_counts() -> None:
    views = [SliceView.from_slice(slice_spec("n1", 1, {"old": "a"})),
             SliceView.from_slice(slice_spec("n1", 2, {"d0": "a", "d1": "b"})),
             SliceView.from_slice(slice_spec("n2", 1, {"d0": "a"}))]
    grouped = devices_by_policy(views)
    assert grouped["a"] == {DeviceRef("n1", "d0"), DeviceRef("n2", "d0")}
    assert grouped["b"] == {DeviceRef("n1", "d1")}


def test_unqualified_attribute_is_not_ours() -> None:
    spec = {"pool": {"name": "n", "generation": 1}, "devices": [{"name": "d", "attributes": {"policy": {"string": "a"}}}]}
    assert devices_by_policy([SliceView.from_slice(spec)]) == {}


def test_usage_counts_per_namespace_and_lists_claims() -> None:
    mine = {DeviceRef("n1", "d0"), DeviceRef("n1", "d1")}
    status = {"allocation": {"devices": {"results": [
        {"driver": "gpu.gpuslice.dev", "pool": "n1", "device": "d0", "request": "gpu"},
        {"driver": "other.example.com", "pool": "n1", "device": "d1", "request": "gpu"},
    ]}}}
    claims = [c for c in (ClaimView.from_claim("a", "c1", status), ClaimView.from_claim("b", "c2", {})) if c]
    result = usage(mine, claims)
    assert (result.allocated, result.by_namespace, result.holding_claims) == (1, {"a": 1}, ["a/c1"])


def test_devices_of_a_pool_being_rewritten_are_not_counted() -> None:
    def view(generation: int, count: int, devices: list[str]) -> SliceView:
        spec = slice_spec("n1", generation, dict.fromkeys(devices, "p"))
        spec["pool"]["resourceSliceCount"] = count
        return SliceView.from_slice(spec)

    old, new = view(1, 1, ["a", "b"]), view(2, 2, ["c"])  # generation 2 has one of its two slices so far
    assert devices_by_policy([old, new]) == {}
    assert devices_by_policy([old, new, view(2, 2, ["d"])]) == {"p": {DeviceRef("n1", d) for d in ("c", "d")}}
