"""The promises a fault must never break, checked all along a test by a background task.

Each check reads one consistent snapshot of the cluster: gpuslice's ResourceSlices, then the
ResourceClaims at exactly the same etcd revision (resourceVersionMatch=Exact), so a claim
released between two reads can never look like a device removed under it. A pool counts as
the scheduler counts it: its highest generation, and only when that generation is complete
(the scheduler allocates nothing from an incomplete pool and ignores older generations).

- No over-allocation: per physical GPU (the device's ``uuid`` or ``parentUUID``), the memory of
  the devices claims hold (a shared device: the capacity each claim consumed) stays within
  the GPU's memory.
- An allocated device is never removed or changed: while a claim holds it, it stays in its
  pool with the content it had when first seen allocated. Taints are not content: a held
  device legitimately gains ``gpuslice.dev/pending-change``, and health taints may come.

A result with ``adminAccess: true`` takes no device (the scheduler counts nothing taken) and holds
nothing back (docs/agent.md): it is in neither invariant.

A pool the kubelet wiped (a fault a test injects: the plugin away for 30 s) has no slices at all
until its agent publishes it again; while it has none, the test says so (``expect_wipe``) and its
devices are not counted missing. Once it has slices again, every check applies to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from gpuslice.dra.names import DRIVER
from gpuslice.dra.quantity import quantity_bytes
from gpuslice.inventory.catalog import MODELS
from gpuslice.kube.client import KubeClient, KubeError
from gpuslice.planning.node.pool_safety import normalized

RESOURCE = "/apis/resource.k8s.io/v1"
GPU_MEMORY = {m.product_name: m.memory for m in MODELS.values()}


def _content(device: dict[str, Any]) -> str:
    return json.dumps(normalized({k: v for k, v in device.items() if k != "taints"}), sort_keys=True, default=str)


def _gpu(device: dict[str, Any]) -> tuple[str, int]:
    attributes = device.get("attributes") or {}
    uuid = (attributes.get("gpuslice.dev/uuid") or attributes.get("gpuslice.dev/parentUUID") or {}).get("string", "?")
    product = (attributes.get("gpuslice.dev/productName") or {}).get("string", "")
    return str(uuid), GPU_MEMORY.get(str(product), 0)


def complete_pools(slices: list[dict[str, Any]]) -> tuple[dict[str, dict[str, dict[str, Any]]], set[str]]:
    """Devices of each pool as the scheduler sees it (complete, highest generation), and the
    pools it would not allocate from at all (incomplete)."""
    by_pool: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for item in slices:
        by_pool[item["spec"]["pool"]["name"]].append(item)
    pools, incomplete = {}, set()
    for pool, items in by_pool.items():
        top = max(int(s["spec"]["pool"]["generation"]) for s in items)
        current = [s for s in items if int(s["spec"]["pool"]["generation"]) == top]
        if len(current) != int(current[0]["spec"]["pool"]["resourceSliceCount"]):
            incomplete.add(pool)
            continue
        pools[pool] = {d["name"]: d for s in current for d in s["spec"].get("devices") or []}
    return pools, incomplete


@dataclass
class InvariantChecker:
    kube: KubeClient
    interval: float = 0.25
    violations: list[str] = field(default_factory=list)
    snapshots: int = 0
    first_seen: dict[tuple[str, str, str], str] = field(default_factory=dict)  # (claim uid, pool, device)
    known: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # last content of every device
    allocations_seen: int = 0  # allocation results checked (a test asserts the checker saw work)
    wiping: set[str] = field(default_factory=set)  # pools a test lets the kubelet wipe
    gone: set[str] = field(default_factory=set)  # of those, the ones seen without slices

    def expect_wipe(self, pool: str) -> None:
        """``pool`` may lose all its slices (the kubelet wipes them) until it is published again."""
        self.wiping.add(pool)

    def _violate(self, message: str) -> None:
        if message not in self.violations:
            self.violations.append(message)

    async def check(self) -> bool:
        """One snapshot; False when the cluster could not answer (a stall, a restart)."""
        try:
            listing = await self.kube.get(f"{RESOURCE}/resourceslices", fieldSelector=f"spec.driver={DRIVER}")
            revision = listing["metadata"]["resourceVersion"]
            claims = await self.kube.get(f"{RESOURCE}/resourceclaims", resourceVersion=revision,
                                         resourceVersionMatch="Exact")
        except KubeError:
            return False
        self.snapshots += 1
        pools, incomplete = complete_pools(listing.get("items") or [])
        present = {item["spec"]["pool"]["name"] for item in listing.get("items") or []}
        absent = self.wiping - present
        self.gone |= absent
        back = self.gone & present  # wiped and published again: checked as any other pool from now
        self.wiping -= back
        self.gone -= back
        for pool, published in pools.items():
            for name, body in published.items():
                self.known[(pool, name)] = body
        used: dict[str, int] = defaultdict(int)
        memory: dict[str, int] = {}
        holders: dict[str, list[str]] = defaultdict(list)
        live_keys = set()
        for claim in claims.get("items") or []:
            allocation = (claim.get("status") or {}).get("allocation") or {}
            who = f"{claim['metadata']['namespace']}/{claim['metadata']['name']}"
            for result in (allocation.get("devices") or {}).get("results") or []:
                if result.get("driver") != DRIVER or result.get("adminAccess"):
                    continue
                pool, name = result["pool"], result["device"]
                key = (claim["metadata"]["uid"], pool, name)
                live_keys.add(key)
                self.allocations_seen += 1
                device: dict[str, Any] | None = pools.get(pool, {}).get(name)
                if device is None and pool not in incomplete and pool not in absent:
                    self._violate(f"claim {who} holds device {pool}/{name}, which its pool does not publish"
                                  f" (at revision {revision})")
                if device is not None:
                    content = _content(device)
                    if self.first_seen.setdefault(key, content) != content:
                        self._violate(f"device {pool}/{name} changed while claim {who} holds it:"
                                      f" {self.first_seen[key]} -> {content}")
                described = device or self.known.get((pool, name))
                if described is None:
                    continue  # never seen published: counted as missing above
                gpu, total = _gpu(described)
                consumed = (result.get("consumedCapacity") or {}).get("memory")
                size = consumed or described["capacity"]["memory"]["value"]
                used[gpu] += quantity_bytes(str(size))
                memory[gpu] = total
                holders[gpu].append(f"{who}:{name}")
        for gpu, total in memory.items():
            if total and used[gpu] > total:
                self._violate(f"GPU {gpu} is over-allocated: {used[gpu]} bytes of {total} held by"
                              f" {sorted(holders[gpu])}")
        self.first_seen = {k: v for k, v in self.first_seen.items() if k in live_keys}
        return True

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.check()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval)

    def assert_held(self) -> None:
        assert not self.violations, "invariants broken:\n" + "\n".join(self.violations)
