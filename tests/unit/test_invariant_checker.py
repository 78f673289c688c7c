"""The faults tier's invariant checker, on snapshots made up to break each invariant once."""

from __future__ import annotations

from typing import Any, cast

from gpuslice.agent.gpus.fake import FakeBackend
from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.dra.resourceslice import resource_slice
from gpuslice.kube.client import KubeClient
from gpuslice.planning.node.node_pool import plan_node_pool
from tests.cluster.faults.invariants import InvariantChecker

GPUS = FakeBackend("n1", [("h100-80gb", 1)]).discover()


def pool(size: str, generation: int = 1) -> list[dict[str, Any]]:
    policy = GpuSlicePolicy.model_validate({"metadata": {"name": "p", "creationTimestamp": "2026-11-29T10:00:00Z"},
                                            "spec": {"slicing": {"mode": "memory", "sliceSize": size}}})
    plan = plan_node_pool({}, GPUS, [policy])
    return [resource_slice("n1", "uid", s.suffix, generation, len(plan.slices), shared_counters=list(s.shared_counters),
                           devices=list(s.devices)) for s in plan.slices]


def claim(name: str, *devices: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "t", "name": name, "uid": f"u-{name}"},
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": "gpu.gpuslice.dev", "pool": "n1", "device": d} for d in devices]}}}}


class Snapshots:
    def __init__(self) -> None:
        self.slices: list[dict[str, Any]] = []
        self.claims: list[dict[str, Any]] = []

    async def get(self, path: str, **query: Any) -> dict[str, Any]:
        if path.endswith("/resourceslices"):
            return {"metadata": {"resourceVersion": "7"}, "items": self.slices}
        assert query == {"resourceVersion": "7", "resourceVersionMatch": "Exact"}, "claims at the slices' revision"
        return {"items": self.claims}


def names(slices: list[dict[str, Any]]) -> list[str]:
    return [d["name"] for s in slices for d in s["spec"].get("devices") or []]


async def test_a_held_device_that_goes_and_the_memory_it_frees_handed_out_again_are_both_caught() -> None:
    cluster = Snapshots()
    checker = InvariantChecker(cast(KubeClient, cluster))
    ten = pool("10G")
    cluster.slices, cluster.claims = ten, [claim("a", *names(ten)[:5])]
    assert await checker.check()
    assert checker.violations == []

    twenty = pool("20G", generation=2)
    cluster.slices, cluster.claims = twenty, [claim("a", *names(ten)[:5]), claim("b", *names(twenty))]
    await checker.check()
    assert any("which its pool does not publish" in v for v in checker.violations)
    assert any("is over-allocated: 130000000000 bytes" in v for v in checker.violations)


async def test_a_held_device_that_changes_is_caught_but_a_new_taint_is_not_a_change() -> None:
    cluster = Snapshots()
    checker = InvariantChecker(cast(KubeClient, cluster))
    ten = pool("10G")
    first = names(ten)[0]
    cluster.slices, cluster.claims = ten, [claim("a", first)]
    await checker.check()
    ten[1]["spec"]["devices"][0]["taints"] = [{"key": "gpuslice.dev/pending-change", "effect": "NoSchedule"}]
    await checker.check()
    assert checker.violations == []
    ten[1]["spec"]["devices"][0]["capacity"]["memory"]["value"] = "20G"
    await checker.check()
    assert any(f"device n1/{first} changed" in v for v in checker.violations)


async def test_an_incomplete_pool_is_not_judged() -> None:
    cluster = Snapshots()
    checker = InvariantChecker(cast(KubeClient, cluster))
    ten = pool("10G")
    cluster.slices, cluster.claims = ten[:1], [claim("a", names(ten)[0])]  # the devices slice not written yet
    await checker.check()
    assert checker.violations == []


async def test_a_wiped_pool_is_excused_only_until_it_is_published_again() -> None:
    """The kubelet wipes a pool whose plugin went away: a test injecting that says so. The pool that
    comes back without a device a claim holds is caught (T9 of the December review)."""
    cluster = Snapshots()
    checker = InvariantChecker(cast(KubeClient, cluster))
    ten = pool("10G")
    held = names(ten)[0]
    cluster.slices, cluster.claims = ten, [claim("a", held)]
    checker.expect_wipe("n1")
    await checker.check()
    cluster.slices = []  # wiped
    await checker.check()
    assert checker.violations == [], "a wiped pool is not a removed device"
    cluster.slices = pool("20G", generation=2)  # back, without the held device
    await checker.check()
    assert any(f"holds device n1/{held}, which its pool does not publish" in v for v in checker.violations)
    cluster.slices = []
    checker.violations.clear()
    await checker.check()
    assert checker.violations, "excused once: a pool that goes again unannounced is caught"


async def test_without_the_excuse_a_pool_that_vanishes_is_caught() -> None:
    cluster = Snapshots()
    checker = InvariantChecker(cast(KubeClient, cluster))
    ten = pool("10G")
    cluster.slices, cluster.claims = ten, [claim("a", names(ten)[0])]
    await checker.check()
    cluster.slices = []
    await checker.check()
    assert checker.violations


async def test_admin_access_takes_nothing_so_it_is_in_neither_invariant() -> None:
    cluster = Snapshots()
    checker = InvariantChecker(cast(KubeClient, cluster))
    ten = pool("10G")
    watch = claim("watch", *names(ten))
    for result in watch["status"]["allocation"]["devices"]["results"]:
        result["adminAccess"] = True
    cluster.slices, cluster.claims = ten, [watch, claim("a", *names(ten))]
    await checker.check()
    assert checker.violations == [], "watching the devices a claim has is no over-allocation"
    cluster.slices, cluster.claims = pool("20G", generation=2), [watch]
    await checker.check()
    assert checker.violations == [], "nor are the devices it watched held back"
