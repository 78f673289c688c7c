"""A node's GPUs as its labels describe them, and the one spelling of a product.

The controller judges policies against the nodes they select before any agent has published a
device, so it reads what the node says about itself: the dev cluster's and kind's fake-GPU
labels, or the labels NVIDIA GPU Feature Discovery puts on real GPU nodes.

GFD's labels, as NVIDIA/k8s-device-plugin's ``internal/lm`` writes them:

- ``nvidia.com/gpu.product`` is NVML's name sanitised (``resource.go``, ``sanitise``: characters
  outside ``[A-Za-z0-9-_. ]`` dropped, runs of blanks made one ``-``), so ``NVIDIA H100 80GB HBM3``
  is ``NVIDIA-H100-80GB-HBM3``; ``-SHARED`` is appended when the device plugin time-slices the GPU.
- With MIG strategy ``none`` or ``mixed`` (``mig-strategy.go``), ``nvidia.com/gpu.{product,count,
  memory}`` describe the full GPUs, MIG-enabled ones included; ``mixed`` adds
  ``nvidia.com/mig-<profile>.*`` for the MIG devices, which are not GPUs.
- With strategy ``single`` (the GPU Operator's default, its ``values.yaml``: ``mig.strategy``),
  once MIG is on the same ``nvidia.com/gpu.*`` labels describe the MIG devices instead (they are
  merged last and win): product ``<model>-MIG-<profile>``, count the MIG devices, memory one
  MIG device's; or ``<model>-MIG-INVALID``, count and memory 0, on a layout GFD cannot label.

So under ``single`` the labels say only the model: its memory comes from the catalog when the
model is there, and the node's GPU count is not known from labels at all (the agent, which reads
NVML, publishes the GPUs whatever the labels say). A selector's products match on the sanitised
form (``product_key``), so NVML's name, GFD's label and either spelling in a policy are one product.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from gpuslice.inventory.catalog import MODELS, GpuModel
from gpuslice.inventory.systems import SYSTEMS

FAKE_BACKEND = "gpuslice.dev/gpu-backend"
FAKE_MODEL = "gpuslice.dev/fake-gpu-model"
FAKE_COUNT = "gpuslice.dev/fake-gpu-count"
FAKE_SYSTEM = "gpuslice.dev/fake-system"  # a whole server of inventory.systems: its GPUs, and where each sits
GFD_PRODUCT = "nvidia.com/gpu.product"
GFD_MEMORY_MIB = "nvidia.com/gpu.memory"
GFD_COUNT = "nvidia.com/gpu.count"
GFD_MIG_STRATEGY = "nvidia.com/mig.strategy"
_UNSAFE = re.compile(r"[^A-Za-z0-9\-_. ]")
_MIG_SUFFIX = re.compile(r"-MIG-(.+)$")


def product_key(name: str) -> str:
    """The product as GFD writes it: ``NVIDIA H100 80GB HBM3`` and ``NVIDIA-H100-80GB-HBM3`` are one."""
    return "-".join(_UNSAFE.sub("", name).split())


def same_product(a: str, b: str) -> bool:
    return product_key(a) == product_key(b)


def catalog_model(product: str) -> GpuModel | None:
    key = product_key(product)
    return next((m for m in MODELS.values() if product_key(m.product_name) == key), None)


@dataclass(frozen=True)
class NodeGpus:
    """``count`` identical GPUs on one node (nodes mix models rarely; we do not model it).

    ``memory`` and ``count`` are None where the labels do not say (GFD's ``single`` MIG strategy
    labels the MIG devices, not the GPUs); ``mig_devices`` then names what the labels describe.
    """

    node: str
    product_name: str
    memory: int | None
    count: int | None
    model: GpuModel | None  # None for a product the catalog does not know
    mig_devices: str | None = None  # e.g. "7 x 1g.5gb of 4864 MiB" under GFD's single strategy

    @property
    def mig_profiles(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.model.mig_profiles) if self.model else ()

    @property
    def product(self) -> str:
        return product_key(self.product_name)


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def node_gpus(name: str, labels: Mapping[str, str]) -> NodeGpus | None:
    """What the labels say; None for a node that has no GPUs we can see."""
    if labels.get(FAKE_BACKEND) == "fake":
        system = SYSTEMS.get(labels.get(FAKE_SYSTEM, ""))
        model = MODELS.get(system.model if system else labels.get(FAKE_MODEL, ""))
        count = len(system.gpus) if system else _int(labels.get(FAKE_COUNT))
        if model is None or not count:
            return None
        return NodeGpus(name, model.product_name, model.memory, count, model)
    product = labels.get(GFD_PRODUCT)
    if not product:
        return None
    product = product.removesuffix("-SHARED")  # the device plugin's time-slicing, not another model
    count, mib = _int(labels.get(GFD_COUNT)), _int(labels.get(GFD_MEMORY_MIB))
    mig = _MIG_SUFFIX.search(product)
    if mig is not None:  # strategy single: the labels describe MIG devices
        gpu = product[:mig.start()]
        model = catalog_model(gpu)
        what = ("none GFD can label (MIG-INVALID)" if mig.group(1) == "INVALID"
                else f"{count} x {mig.group(1)} of {mib} MiB")
        return NodeGpus(name, model.product_name if model else gpu, model.memory if model else None, None, model,
                        mig_devices=what)
    if not count or not mib:
        return None
    model = catalog_model(product)
    return NodeGpus(name, model.product_name if model else product, mib * 1024**2, count, model)
