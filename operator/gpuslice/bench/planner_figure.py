"""Figure 4: how fast the pure planner is (no cluster): one node of 8 GPUs in each mode, and a
policy judged against 10,000 GPUs (what the controller does on every policy change)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from gpuslice.agent.gpus.fake import FakeBackend
from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.devcluster.nodes import fake_gpu_node
from gpuslice.inventory.nodes import node_gpus
from gpuslice.planning.node.node_pool import plan_node_pool
from gpuslice.planning.selection import select
from gpuslice.planning.validation import validate

MODES: dict[str, dict[str, Any]] = {
    "memory (10G)": {"mode": "memory", "sliceSize": "10G"},
    "memory (10G + whole GPU)": {"mode": "memory", "sliceSize": "10G", "allowFullGpu": True},
    "shared (step 1Gi)": {"mode": "shared", "sliceSize": "1Gi"},
    "mig dynamic (4 profiles)": {"mode": "mig", "mig": {"profiles": ["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"]}},
    "mig static (balanced)": {"mode": "mig", "mig": {"layout": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}}},
}


def _policy(name: str, slicing: dict[str, Any]) -> GpuSlicePolicy:
    return GpuSlicePolicy.from_body({
        "apiVersion": "gpuslice.dev/v1alpha1", "kind": "GpuSlicePolicy",
        "metadata": {"name": name, "generation": 1, "creationTimestamp": "2026-01-01T00:00:00Z", "uid": name},
        "spec": {"slicing": slicing, "tenants": [{"namespace": "team-a"}]}})


def _best_ms(run: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best * 1000


def planner_figure(gpus: int = 10_000, repeat: int = 20) -> dict[str, Any]:
    node_gpus_ = FakeBackend("node-1", [("h100-80gb", 8)]).discover()
    plan_ms = {}
    devices = {}
    for label, slicing in MODES.items():
        policy = _policy("p", slicing)
        def plan(p: GpuSlicePolicy = policy) -> object:
            return plan_node_pool({}, node_gpus_, [p])

        plan_ms[label] = round(_best_ms(plan, repeat), 3)
        devices[label] = len(plan_node_pool({}, node_gpus_, [policy]).devices)
    nodes = gpus // 8
    labels = {f"n-{i}": fake_gpu_node(f"n-{i}", "h100-80gb", 8)["metadata"]["labels"] for i in range(nodes)}
    policy = _policy("candidate", MODES["memory (10G)"])
    others = [_policy(f"other-{i}", MODES["memory (10G)"]) for i in range(10)]

    def judge() -> None:
        """As the controller's reconcile does: the inventory from node labels, every policy's
        selection, then the candidate judged against the others."""
        inventory = [(node_labels, found) for name, node_labels in sorted(labels.items())
                     if (found := node_gpus(name, node_labels)) is not None]
        validate(policy, select(policy, inventory), [(o, select(o, inventory)) for o in others])

    return {"plan_node_ms": plan_ms, "devices_per_node": devices, "validate_gpus": nodes * 8,
            "validate_other_policies": len(others),
            "validate_10k_gpus_ms": round(_best_ms(judge, max(3, repeat // 4)), 2)}
