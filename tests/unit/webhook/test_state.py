"""The webhook's caches: what it knows of each device's memory follows the slices, relists included."""

from __future__ import annotations

from typing import Any, cast

from gpuslice.kube.client import KubeClient
from gpuslice.webhook.state import State


def _slice(name: str, pool: str, devices: dict[str, str], node: str | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"driver": "gpu.gpuslice.dev", "pool": {"name": pool},
                                                 "nodeName": node or pool, "devices": [
        {"name": d, "capacity": {"memory": {"value": m}}} for d, m in devices.items()]}}


def test_device_memory_follows_the_slices_and_a_relist_forgets_what_it_misses() -> None:
    state = State(cast(KubeClient, None))
    state.slices.handle(None, _slice("a-gen1", "node-a", {"s-0": "10Gi", "s-1": "10Gi"}))
    state.slices.handle(None, _slice("a-gen2", "node-a", {"s-0": "10Gi"}))
    state.slices.handle(None, _slice("b", "node-b", {"full": "81559Mi"}))
    state.slices.listed()
    assert state.device_memory("node-a", "s-1") == 10 * 2**30
    assert state.device_memory("node-b", "full") == 81559 * 2**20
    state.slices.handle("DELETED", _slice("a-gen1", "node-a", {}))
    assert state.device_memory("node-a", "s-1") is None  # no slice names it any more
    assert state.device_memory("node-a", "s-0") == 10 * 2**30  # the newer generation still does
    # A relist that no longer lists node-b's slice (deleted while the watch was down) forgets it.
    state.slices.handle(None, _slice("a-gen2", "node-a", {"s-0": "10Gi"}))
    state.slices.listed()
    assert state.device_memory("node-b", "full") is None


def test_claims_are_kept_by_namespace_and_only_gpuslices() -> None:
    state = State(cast(KubeClient, None))

    def claim(ns: str, uid: str, klass: str) -> dict[str, Any]:
        return {"metadata": {"namespace": ns, "name": uid, "uid": uid},
                "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": klass}}]}}}

    state.claims.handle(None, claim("team-a", "u1", "p.gpuslice.dev"))
    state.claims.handle(None, claim("team-a", "u2", "nic.example.com"))
    state.claims.handle(None, claim("team-b", "u3", "full.p.gpuslice.dev"))
    assert [c["metadata"]["uid"] for c in state.namespace_claims("team-a")] == ["u1"]
    assert state.dirty == {"team-a", "team-b"}
    state.claims.handle("DELETED", claim("team-a", "u1", "p.gpuslice.dev"))
    assert state.namespace_claims("team-a") == []


def test_a_slice_under_another_nodes_pool_name_resizes_nothing() -> None:
    """A kubelet may publish a slice of its own node under any pool name (NodeRestriction checks only
    spec.nodeName): one named after another node leaves that node's devices as their own slice says."""
    state = State(cast(KubeClient, None))
    state.slices.handle(None, _slice("a", "node-a", {"s-0": "10Gi"}))
    state.slices.handle("ADDED", _slice("rogue", "node-a", {"s-0": "1Mi", "s-9": "1Mi"}, node="node-b"))
    assert state.device_memory("node-a", "s-0") == 10 * 2**30
    assert state.device_memory("node-a", "s-9") is None
