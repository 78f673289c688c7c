"""A node's GPUs as its labels describe them.

The controller judges policies against the nodes they select before any
agent has published a device, so it reads what the node says about itself:
the dev cluster's and kind's fake-GPU labels, or the labels NVIDIA GPU
Feature Discovery puts on real GPU nodes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpuslice.inventory.catalog import MODELS, GpuModel

FAKE_BACKEND = "gpuslice.dev/gpu-backend"
FAKE_MODEL = "gpuslice.dev/fake-gpu-model"
FAKE_COUNT = "gpuslice.dev/fake-gpu-count"
GFD_PRODUCT = "nvidia.com/gpu.product"
GFD_MEMORY_MIB = "nvidia.com/gpu.memory"
GFD_COUNT = "nvidia.com/gpu.count"


@dataclass(frozen=True)
class NodeGpus:
    """``count`` identical GPUs on one node (nodes mix models rarely; we do not model it)."""

    node: str
    product_name: str
    memory: int
    count: int
    model: GpuModel | None  # None for a product the catalog does not know

    @property
    def mig_profiles(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.model.mig_profiles) if self.model else ()


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def node_gpus(name: str, labels: Mapping[str, str]) -> NodeGpus | None:
    """What the labels say; None for a node that has no GPUs we can see."""
    if labels.get(FAKE_BACKEND) == "fake":
        model = MODELS.get(labels.get(FAKE_MODEL, ""))
        count = _int(labels.get(FAKE_COUNT))
        if model is None or not count:
            return None
        return NodeGpus(name, model.product_name, model.memory, count, model)
    product = labels.get(GFD_PRODUCT)
    count, mib = _int(labels.get(GFD_COUNT)), _int(labels.get(GFD_MEMORY_MIB))
    if not product or not count or not mib:
        return None
    model = next((m for m in MODELS.values() if m.product_name.replace(" ", "-") == product), None)
    return NodeGpus(name, model.product_name if model else product, mib * 1024**2, count, model)
