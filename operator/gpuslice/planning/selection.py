"""Which GPUs a policy selects, which policy is senior, and what is wrong with a policy.

Shared by validation (the controller) and the slicing modes (the planner).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.inventory.nodes import NodeGpus, product_key

# Slices of one GPU in memory mode: enough for any real sharing (MIG has 7, MPS 48 clients), and
# a bound on what a tiny sliceSize would make the agent publish and the scheduler consider.
MAX_SLICES_PER_GPU = 64


@dataclass(frozen=True)
class Problem:
    reason: str
    message: str


@dataclass(frozen=True)
class Selection:
    """The GPUs a policy selects, node by node."""

    gpus: tuple[NodeGpus, ...]

    @property
    def node_count(self) -> int:
        return len(self.gpus)

    @property
    def gpu_count(self) -> int:
        """GPUs the labels count (a node under GFD's single MIG strategy counts none: they do not say)."""
        return sum(g.count or 0 for g in self.gpus)

    @property
    def sized(self) -> tuple[NodeGpus, ...]:
        """The selected GPUs whose memory is known (judged by size; the others by their agent)."""
        return tuple(g for g in self.gpus if g.memory is not None)

    @property
    def nodes(self) -> frozenset[str]:
        return frozenset(g.node for g in self.gpus)


def select(policy: GpuSlicePolicy, inventory: Iterable[tuple[dict[str, str], NodeGpus]]) -> Selection:
    """Nodes whose labels match the node selector, with GPUs that match the GPU selector."""
    chosen = []
    gpu_selector = policy.spec.gpu_selector
    for labels, gpus in inventory:
        if not policy.spec.node_selector.matches(labels):
            continue
        if gpu_selector.products and gpus.product not in {product_key(p) for p in gpu_selector.products}:
            continue
        if gpus.memory is not None and gpus.memory < gpu_selector.min_memory_bytes:
            continue  # unknown memory: the node's agent, which reads NVML, leaves small GPUs out
        chosen.append(gpus)
    return Selection(tuple(sorted(chosen, key=lambda g: g.node)))


def selected_nodes(policy: GpuSlicePolicy, labels: Mapping[str, Mapping[str, str]],
                   gpu_nodes: Collection[str]) -> tuple[str, ...]:
    """The nodes whose devices of ``policy`` tenants may be allocated: those ``spec.nodeSelector``
    matches among ``gpu_nodes`` (nodes with GPUs by their labels, or a gpuslice agent's pool). Not
    the GPU selector: which GPUs a node has is for its agent, which reads them; whose a node is, is
    what a compromised agent must not decide."""
    selector = policy.spec.node_selector
    return tuple(sorted(n for n in set(gpu_nodes) if n in labels and selector.matches(dict(labels[n]))))


def seniority(policy: GpuSlicePolicy) -> tuple[str, int, str]:
    """Older first. Creation times have one-second resolution; within the same second a
    policy that is already valid (serving tenants) stays ahead of one that is not yet."""
    valid = any(c.type == "Valid" and c.status == "True" for c in policy.status.conditions)
    return (policy.metadata.creation_timestamp, 0 if valid else 1, policy.name)
