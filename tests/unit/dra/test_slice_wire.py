"""The one reader of a ResourceSlice's spec: what it publishes, and what a malformed spec reads as."""

from __future__ import annotations

from typing import Any

import pytest

from gpuslice.dra.slice_wire import slice_counter_sets, slice_devices, slice_node, slice_pool

SPEC: dict[str, Any] = {
    "driver": "gpu.gpuslice.dev", "nodeName": "n1", "pool": {"name": "n1", "generation": 3, "resourceSliceCount": 2},
    "sharedCounters": [{"name": "gpu-0", "counters": {"memory": {"value": "80Gi"}}}],
    "devices": [{"name": "gpu-0-mem-0"}, {"name": "gpu-0-mem-1"}],
}


def test_a_slice_reads_as_published() -> None:
    assert slice_devices(SPEC) == SPEC["devices"]
    assert slice_counter_sets(SPEC) == SPEC["sharedCounters"]
    assert (slice_node(SPEC), slice_pool(SPEC)) == ("n1", "n1")


def test_devices_and_counter_sets_keep_their_order_and_are_the_published_objects() -> None:
    devices = slice_devices(SPEC)
    assert [d["name"] for d in devices] == ["gpu-0-mem-0", "gpu-0-mem-1"]
    assert devices[0] is SPEC["devices"][0]


@pytest.mark.parametrize("spec", [
    {}, {"devices": None, "sharedCounters": None, "nodeName": None, "pool": None},
    {"devices": "gpu-0", "sharedCounters": {"name": "gpu-0"}, "pool": "n1"},
    {"devices": {"name": "gpu-0"}, "sharedCounters": 7, "pool": {"name": None}},
    {"pool": {}},
])
def test_a_missing_null_or_malformed_field_reads_as_nothing(spec: dict[str, Any]) -> None:
    assert slice_devices(spec) == []
    assert slice_counter_sets(spec) == []
    assert slice_pool(spec) is None
    assert slice_node(spec) is None


def test_entries_that_are_not_objects_are_left_out() -> None:
    spec = {"devices": [None, "gpu-0", {"name": "gpu-1"}, 3], "sharedCounters": [[], {"name": "c"}]}
    assert slice_devices(spec) == [{"name": "gpu-1"}]
    assert slice_counter_sets(spec) == [{"name": "c"}]


def test_a_slice_of_no_one_node_has_no_node_but_its_pool() -> None:
    spec = {"allNodes": True, "pool": {"name": "fabric"}, "devices": []}
    assert (slice_node(spec), slice_pool(spec)) == (None, "fabric")


def test_an_empty_name_is_kept_apart_from_none() -> None:
    """own_pool compares node and pool: '' and a missing field must not read alike."""
    assert slice_node({"nodeName": ""}) == ""
    assert slice_pool({"pool": {"name": ""}}) == ""
