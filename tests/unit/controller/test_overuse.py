"""What the controller does with a mark on a claim several pods share: an Event on every pod named, and
with onOveruse: Evict the eviction of only those the mark chose (the largest users, until the rest fit)."""

from __future__ import annotations

from typing import Any

from gpuslice.controller.overuse import OveruseEnforcer, Policies
from gpuslice.planning.overuse import DeviceKey, Mark, Overuser, device_entry

NODE, NAMESPACE = "node-a", "team-a"
PODS = {"s0": "0f3a7c4e-0000-4c2a-9a51-000000000000", "s1": "0f3a7c4e-1111-4c2a-9a51-000000000001",
        "s2": "0f3a7c4e-2222-4c2a-9a51-000000000002"}


class Cluster:
    """Just what the enforcer asks of the API server: pods to read, Events and evictions to record."""

    def __init__(self) -> None:
        self.evicted: list[str] = []
        self.events: list[tuple[str, str]] = []

    async def get(self, path: str) -> dict[str, Any]:
        name = path.rsplit("/", 1)[1]
        return {"metadata": {"name": name, "namespace": NAMESPACE, "uid": PODS[name]}, "spec": {"nodeName": NODE}}

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if path.endswith("/eviction"):
            self.evicted.append(body["metadata"]["name"])
        else:
            self.events.append((body["involvedObject"]["name"], body["reason"]))
        return body


def status(evict: set[str]) -> dict[str, Any]:
    users = tuple(Overuser(uid, name, "2026-12-01T10:00:00Z", f"pod {NAMESPACE}/{name} uses 9Gi", name in evict)
                  for name, uid in PODS.items())
    return {
        "allocation": {"nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]},
            "devices": {"results": [{"request": "gpu", "driver": "gpu.gpuslice.dev", "pool": NODE, "device": "d0"}]}},
        "reservedFor": [{"resource": "pods", "name": name, "uid": uid} for name, uid in PODS.items()],
        "devices": [device_entry(DeviceKey(NODE, "d0"), Mark(users, "m", "2026-12-01T10:00:00Z"))],
    }


def policies(on_overuse: str) -> Policies:
    return Policies(policy_of=lambda pool, device: "p", on_overuse=lambda policy: on_overuse)


async def test_evict_takes_only_the_pods_the_mark_chose_and_tells_every_pod_named() -> None:
    cluster, enforcer = Cluster(), OveruseEnforcer(clock=lambda: 1.0)
    await enforcer.claim_seen(cluster, (NAMESPACE, "shared"), status({"s0", "s1"}), policies("Evict"))  # type: ignore[arg-type]
    assert sorted(cluster.evicted) == ["s0", "s1"]
    assert sorted(cluster.events) == [("s0", "GpuMemoryOveruse"), ("s0", "GpuMemoryOveruseEvicted"),
                                      ("s1", "GpuMemoryOveruse"), ("s1", "GpuMemoryOveruseEvicted"),
                                      ("s2", "GpuMemoryOveruse")]

    # The agent chooses s2 as well (its use grew): it goes then, and s0 and s1 are not evicted twice.
    await enforcer.claim_seen(cluster, (NAMESPACE, "shared"), status({"s0", "s1", "s2"}), policies("Evict"))  # type: ignore[arg-type]
    assert sorted(cluster.evicted) == ["s0", "s1", "s2"]


async def test_report_evicts_none_of_a_claims_pods() -> None:
    cluster, enforcer = Cluster(), OveruseEnforcer(clock=lambda: 1.0)
    await enforcer.claim_seen(cluster, (NAMESPACE, "shared"), status({"s0"}), policies("Report"))  # type: ignore[arg-type]
    assert cluster.evicted == []
    assert [reason for _, reason in cluster.events] == ["GpuMemoryOveruse"] * 3
