"""Devices per policy and who holds them."""

from __future__ import annotations

from gpuslice.planning.cluster.cluster_objects import DeviceRef
from gpuslice.planning.reads.usage import ClaimView, SliceView, devices_by_policy, published_by_policy, usage


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


def test_every_device_still_published_keeps_its_policy_from_going() -> None:
    """Deletion waits for these: an old generation, an incomplete pool, a pool being rewritten."""
    incomplete = slice_spec("n2", 3, {"x": "p"})
    incomplete["pool"]["resourceSliceCount"] = 2
    views = [SliceView.from_slice(s) for s in (slice_spec("n1", 1, {"old": "p"}), slice_spec("n1", 2, {"new": "q"}),
                                               incomplete)]
    assert devices_by_policy(views) == {"q": {DeviceRef("n1", "new")}}
    assert published_by_policy(views) == {"p": {DeviceRef("n1", "old"), DeviceRef("n2", "x")},
                                          "q": {DeviceRef("n1", "new")}}


def test_usage_in_bytes_and_kinds_and_foreign_claims() -> None:
    from gpuslice.planning.reads.usage import device_info, foreign_claims

    spec = {"driver": "gpu.gpuslice.dev", "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {"name": "s0", "attributes": {"gpuslice.dev/policy": {"string": "p"}, "gpuslice.dev/mode": {"string": "memory"},
                                              "gpuslice.dev/sliceSize": {"string": "10Gi"}},
                 "capacity": {"memory": {"value": "10Gi"}}},
                {"name": "full", "attributes": {"gpuslice.dev/policy": {"string": "p"}, "gpuslice.dev/mode": {"string": "memory"},
                                                "gpuslice.dev/sliceSize": {"string": "full"}},
                 "capacity": {"memory": {"value": "80Gi"}}},
                {"name": "sh", "attributes": {"gpuslice.dev/policy": {"string": "p"}, "gpuslice.dev/mode": {"string": "shared"}},
                 "capacity": {"memory": {"value": "80Gi"}}},
            ]}
    views = [SliceView.from_slice(spec)]
    info = device_info(views)
    assert {ref.device: (i.kind, i.memory) for ref, i in info.items()} == {
        "s0": ("slice", 10 * 1024**3), "full": ("full", 80 * 1024**3), "sh": ("shared", 80 * 1024**3)}
    mine = devices_by_policy(views)["p"]

    def claim(ns: str, name: str, *results: dict[str, object]) -> ClaimView:
        found = ClaimView.from_claim(ns, name, {"allocation": {"devices": {"results": [
            {"driver": "gpu.gpuslice.dev", "pool": "n1", "request": "gpu", **r} for r in results]}}})
        assert found is not None
        return found

    claims = [claim("a", "c1", {"device": "s0"}, {"device": "full"}),
              claim("a", "c2", {"device": "sh", "consumedCapacity": {"memory": "20Gi"}},
                    {"device": "sh", "consumedCapacity": {"memory": "10Gi"}}),
              claim("ops", "watch", {"device": "full", "adminAccess": True}),
              claim("gone", "old", {"device": "s0"})]
    result = usage(mine, claims, info)
    assert result.by_namespace == {"a": 4, "gone": 1}
    assert result.bytes_by_namespace == {"a": 120 * 1024**3, "gone": 10 * 1024**3}
    assert result.kinds_by_namespace["a"] == {"slice": 1, "full": 1, "shared": 2}
    assert "ops/watch" not in result.holding_claims, "admin access takes nothing: deletion does not wait for it"
    assert result.holding_claims == ["a/c1", "a/c2", "gone/old"]
    assert claims[2].taken == ()
    assert claims[0].taken == claims[0].devices
    assert foreign_claims(mine, claims, tenants={"a"}, admins={"ops"}) == ["gone/old"]
    assert foreign_claims(mine, claims, tenants={"a"}, admins=set()) == ["gone/old", "ops/watch"]
