"""A device plugin on the node (pure): NVIDIA's (``nvidia.com/gpu``, ``nvidia.com/mig-<profile>``,
``nvidia.com/gpu.shared``), HAMi's (``nvidia.com/gpu``, ``nvidia.com/gpumem``) or any other that advertises
NVIDIA resources in the Node's allocatable.

A device plugin gives a pod a GPU the kubelet counts, never through DRA: the scheduler would let a pod
of gpuslice's and one of the plugin's have the same GPU. Its resources are counts, naming no GPU (the
plugin itself decides which GPU backs which unit), so every GPU of the node counts as the plugin's:
gpuslice publishes none of them (the devices claims hold stay until released), and says so. Labels
alone would not tell: the GPU Operator's ``nvidia.com/gpu.deploy.device-plugin`` says only where the
Operator deploys its own, and a standalone plugin or HAMi carries no label at all.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.inventory.gpus import Gpu
from gpuslice.planning.left_out import DEVICE_PLUGIN, LeftOut
from gpuslice.planning.node.node_pool import selects

DOMAIN = "nvidia.com/"


def advertised(node: Mapping[str, Any]) -> dict[str, str]:
    """The NVIDIA resources the Node's allocatable advertises (none at zero), by name."""
    allocatable = ((node.get("status") or {}).get("allocatable") or {})
    return {name: str(value) for name, value in sorted(allocatable.items())
            if name.startswith(DOMAIN) and str(value).strip() not in ("", "0")}


def describe(resources: Mapping[str, str]) -> str:
    return ", ".join(f"{name}: {value}" for name, value in sorted(resources.items()))


def left_out(labels: Mapping[str, str], gpus: Sequence[Gpu], policies: Iterable[GpuSlicePolicy],
             resources: Mapping[str, str]) -> tuple[LeftOut, ...]:
    """For the controller's condition: each policy that selects a GPU of a node whose device plugin
    advertises NVIDIA resources, with that GPU."""
    if not resources:
        return ()
    active = [p for p in policies if not p.metadata.deletion_timestamp]
    return tuple(LeftOut(p.name, DEVICE_PLUGIN, gpu.index, gpu.product_name)
                 for gpu in sorted(gpus, key=lambda g: g.index) for p in active if selects(p, labels, gpu))
