"""The one reader of resource.k8s.io JSON: allocation results, devices, pool generations."""

from __future__ import annotations

from typing import Any

from gpuslice.dra import wire
from gpuslice.dra.names import DRIVER


def claim(*results: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "c"}, "status": {"allocation": {"devices": {"results": list(results)}}}}


def test_allocation_results_keep_our_drivers_and_only_the_fields_present() -> None:
    body = claim({"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "d0"},
                 {"request": "nic", "driver": "other.example.com", "pool": "n1", "device": "eth0"},
                 {"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "s0", "shareID": "abc",
                  "adminAccess": True, "consumedCapacity": {"memory": "10Gi"}})
    plain, shared = wire.allocation_results(body)
    assert plain == {"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "d0"}
    assert (wire.admin_access(plain), wire.share_id(plain), wire.consumed_memory(plain)) == (False, "", None)
    assert (wire.admin_access(shared), wire.share_id(shared), wire.consumed_memory(shared)) == (True, "abc", 10 * 2**30)
    assert [r["driver"] for r in wire.allocation_results(body, driver=None)] == [DRIVER, "other.example.com", DRIVER]


def test_a_claim_without_allocation_has_no_results() -> None:
    bodies: tuple[dict[str, Any], ...] = ({}, {"status": {}}, {"status": {"allocation": None}}, {"status": {"allocation": {"devices": {}}}})
    for body in bodies:
        assert wire.allocation_results(body) == []


def test_an_unreadable_consumed_quantity_reads_as_none() -> None:
    (result,) = wire.allocation_results(claim({"request": "g", "driver": DRIVER, "pool": "p", "device": "d",
                                               "consumedCapacity": {"memory": "lots"}}))
    assert wire.consumed_quantity(result) == "lots"
    assert wire.consumed_memory(result) is None


def test_device_policy_is_the_fully_qualified_attribute_only() -> None:
    assert wire.device_policy({"attributes": {"gpuslice.dev/policy": {"string": "a"}}}) == "a"
    assert wire.device_policy({"attributes": {"policy": {"string": "a"}}}) is None  # the driver's domain
    assert wire.device_policy({"attributes": {"gpuslice.dev/policy": {"int": 3}}}) is None
    assert wire.device_policy({"name": "d"}) is None


def test_device_gpu_memory_and_attributes() -> None:
    whole = {"attributes": {"gpuslice.dev/uuid": {"string": "GPU-1"}, "gpuslice.dev/index": {"int": 2}},
             "capacity": {"memory": {"value": "80Gi"}}}
    part = {"attributes": {"gpuslice.dev/parentUUID": {"string": "GPU-1"}}, "capacity": {"memory": {"value": "x"}}}
    assert (wire.device_gpu(whole), wire.device_gpu(part), wire.device_gpu({})) == ("GPU-1", "GPU-1", None)
    assert (wire.device_memory(whole), wire.device_memory(part), wire.device_memory({})) == (80 * 2**30, None, None)
    assert (wire.device_capacity(whole), wire.device_capacity(part), wire.device_capacity({})) == ("80Gi", "x", None)
    assert wire.attribute(whole, "index") == 2
    assert wire.text_attribute(whole, "index") == ""


def spec(pool: str, generation: int, count: int = 1, *devices: str) -> dict[str, Any]:
    return {"driver": DRIVER, "nodeName": pool,
            "pool": {"name": pool, "generation": generation, "resourceSliceCount": count},
            "devices": [{"name": d} for d in devices]}


def test_the_newest_generation_counts_once_complete() -> None:
    slices = [spec("n1", 1, 1, "old"), spec("n1", 2, 2, "a"), spec("n2", 4, 1, "x")]
    found = wire.newest_generations(slices)
    assert (found["n1"].generation, found["n1"].complete) == (2, False)
    assert (found["n2"].generation, found["n2"].complete) == (4, True)
    complete = wire.newest_generation([*slices, spec("n1", 2, 2, "b")], "n1")
    assert complete is not None
    assert complete.complete
    assert [d["name"] for d in wire.devices_of(complete)] == ["a", "b"]
    assert wire.newest_generation(slices, "n3") is None


def test_slices_of_one_generation_that_disagree_on_their_count_need_the_largest() -> None:
    assert wire.newest_of([("p", 1, 1), ("p", 1, 3)]) == {"p": (1, False)}
    assert wire.newest_of([("p", 1, 3), ("p", 1, 1)]) == {"p": (1, False)}
    assert wire.newest_of([("p", 1, 2), ("p", 1, 1)]) == {"p": (1, True)}


def test_device_statuses_keep_our_drivers_and_find_a_condition() -> None:
    status = {"devices": [
        {"driver": DRIVER, "pool": "n1", "device": "d0", "shareID": "s", "data": {"k": 1},
         "conditions": [{"type": "Ready", "status": "True"}, {"type": "GpuMemoryOveruse", "status": "False"}]},
        {"driver": "other.example.com", "pool": "n1", "device": "eth0", "conditions": None},
    ]}
    (ours,) = wire.device_statuses(status)
    assert (ours["pool"], ours["device"], wire.share_id(ours), ours.get("data")) == ("n1", "d0", "s", {"k": 1})
    assert wire.device_condition(ours, "GpuMemoryOveruse") == {"type": "GpuMemoryOveruse", "status": "False"}
    assert wire.device_condition(ours, "Other") is None
    everyone = wire.device_statuses(status, driver=None)
    assert [e["device"] for e in everyone] == ["d0", "eth0"]
    assert everyone[1]["conditions"] == []
    assert "shareID" not in everyone[1]
    assert wire.device_statuses({}) == []


def test_allocation_reservations_and_node_selector() -> None:
    selector = {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}
    status = {"allocation": {"nodeSelector": selector},
              "reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}, {"apiGroup": "x.io", "resource": "jobs"}]}
    assert wire.is_allocated({"status": status})
    assert not wire.is_allocated({"status": {"reservedFor": []}})
    assert wire.allocation_node_selector(status) == selector
    assert wire.allocation_node_selector({}) == {}
    assert wire.reserved_for(status) == [{"apiGroup": "", "resource": "pods", "name": "p", "uid": "u"},
                                         {"apiGroup": "x.io", "resource": "jobs", "name": "", "uid": ""}]


def test_device_requests_name_each_way_as_allocation_results_do() -> None:
    spec = {"devices": {"requests": [
        {"name": "gpu", "exactly": {"deviceClassName": "a.gpuslice.dev", "count": 2, "adminAccess": True}},
        {"name": "any", "firstAvailable": [
            {"name": "big", "deviceClassName": "b.gpuslice.dev", "allocationMode": "All"},
            {"name": "shared", "deviceClassName": "c.gpuslice.dev", "capacity": {"requests": {"memory": "5Gi"}}}]},
    ]}}
    exact, first = wire.device_requests(spec)
    assert wire.request_ways(exact) == [{"name": "gpu", "deviceClassName": "a.gpuslice.dev", "count": 2,
                                         "allocationMode": "ExactCount", "adminAccess": True}]
    big, shared = wire.request_ways(first)
    assert (big["name"], big["allocationMode"], big["count"], "memory" in big) == ("any/big", "All", 1, False)
    assert (shared["name"], shared.get("memory"), shared["adminAccess"]) == ("any/shared", "5Gi", False)
    assert wire.device_requests({}) == []
