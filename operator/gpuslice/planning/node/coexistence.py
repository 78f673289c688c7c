"""Other managers of the same GPUs (pure): another DRA driver's slices, the GPU Operator's MIG manager.

Two drivers publishing one GPU would let the scheduler allocate it twice, once through each. NVIDIA's
DRA kubelet plugin runs on nodes labelled ``nvidia.com/gpu.present=true`` (its chart's
``values.yaml``), the label gpuslice's agent selects on too, so nothing but a check keeps both off
one GPU: an agent publishes no GPU that another driver's slice on its node names, by UUID (a
``uuid`` or ``parentUUID`` attribute in any domain: NVIDIA's GPU and MIG devices carry them) or by
``resource.kubernetes.io/pciBusID`` (NVIDIA's VFIO devices carry only that).

The GPU Operator's MIG manager applies ``nvidia.com/mig.config`` to every MIG-capable GPU of a node
labelled ``nvidia.com/gpu.deploy.mig-manager=true`` (the operator sets that label on MIG-capable
nodes and ``nvidia.com/mig.config=all-disabled`` by default: ``controllers/state_manager.go``,
``nodelabeling_controller.go``), whoever made the GPU's instances. A gpuslice MIG policy (a static
layout, or dynamic instances made at prepare) would be undone by it, so it publishes nothing there.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuslice.dra.slice_wire import slice_devices
from gpuslice.inventory.gpus import Gpu
from gpuslice.inventory.pci import PCI_BUS_ID_ATTRIBUTE, PciAddressError, normalized_bus_id

MIG_MANAGER_LABEL = "nvidia.com/gpu.deploy.mig-manager"
_GPU_UUID = re.compile(r"^(GPU|MIG)-")


@dataclass(frozen=True)
class OtherDriverGpus:
    """What one slice of another driver says about GPUs: the UUIDs and PCI bus ids its devices name."""

    driver: str
    uuids: frozenset[str]
    bus_ids: frozenset[str]
    gpu_devices: int  # devices that name a GPU or MIG UUID (what the controller counts)


def other_driver_gpus(spec: Mapping[str, Any]) -> OtherDriverGpus:
    uuids: set[str] = set()
    bus_ids: set[str] = set()
    gpu_devices = 0
    for device in slice_devices(spec):
        named = False
        for name, value in (device.get("attributes") or {}).items():
            text = (value or {}).get("string")
            if not isinstance(text, str):
                continue
            if name.rsplit("/", 1)[-1] in ("uuid", "parentUUID"):
                uuids.add(text)
                named = named or bool(_GPU_UUID.match(text))
            elif name == PCI_BUS_ID_ATTRIBUTE:
                try:
                    bus_ids.add(normalized_bus_id(text))
                except PciAddressError:
                    continue
        gpu_devices += named
    return OtherDriverGpus(str(spec.get("driver", "")), frozenset(uuids), frozenset(bus_ids), gpu_devices)


def taken_gpus(gpus: Sequence[Gpu], others: Iterable[OtherDriverGpus]) -> dict[str, tuple[str, str]]:
    """GPU UUID -> (the other driver, "UUID" or "PCI bus id") for each GPU another driver publishes."""
    taken: dict[str, tuple[str, str]] = {}
    for other in others:
        for gpu in gpus:
            if gpu.uuid in taken:
                continue
            if gpu.uuid in other.uuids:
                taken[gpu.uuid] = (other.driver, "UUID")
            elif gpu.pci_bus_id in other.bus_ids:
                taken[gpu.uuid] = (other.driver, "PCI bus id")
    return taken


def mig_manager_active(labels: Mapping[str, str]) -> bool:
    return labels.get(MIG_MANAGER_LABEL) == "true"
