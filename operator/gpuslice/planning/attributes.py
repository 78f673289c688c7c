"""The attributes NVIDIA's DRA driver publishes, under gpuslice's driver (pure).

NVIDIA's ``gpu.nvidia.com`` publishes unqualified names, which live in the driver's domain
(``cmd/gpu-kubelet-plugin/deviceinfo.go``, ``GpuInfo.Attributes``; ``mig.go``,
``CommonAttributesMig`` and ``CommonCapacitiesMig``). gpuslice publishes the same names and value
types unqualified, so in its driver's domain ``gpu.gpuslice.dev``: a selector written as
``device.attributes["gpu.nvidia.com"].cudaComputeCapability >= semver("9.0.0")`` ports by changing
the domain (docs/nvidia.md maps each one). gpuslice's own attributes stay in ``gpuslice.dev``.

``index`` and ``minor`` are the ints NVIDIA published until it dropped them (the index moves when a
GPU falls off the bus: NVIDIA/k8s-dra-driver-gpu#563, commits 36fc80ab and 50d90da0); gpuslice
names devices by UUID, and keeps them for people and for selectors written against older releases.
Versions are semver as NVIDIA makes them (Masterminds' coercing parse: ``580.95.05`` is
``580.95.5``, ``9.0`` is ``9.0.0``); the API refuses a version attribute that is not semver 2.0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuslice.inventory.catalog import Engines
from gpuslice.inventory.gpus import Gpu
from gpuslice.inventory.pci import PCI_BUS_ID_ATTRIBUTE, PCIE_ROOT_ATTRIBUTE
from gpuslice.inventory.topology import NUMA_NODE_ATTRIBUTE, NVLINK_DOMAIN_ATTRIBUTE

# NVIDIA's `type`: gpu (a whole GPU: gpuslice's whole-GPU and shared devices), mig; gpuslice adds
# slice for a memory slice, which NVIDIA has no device for.
DEVICE_TYPES = {"full": "gpu", "shared": "gpu", "slice": "slice"}
# The kinds that carry the GPU's NVLink domain: a MIG instance has no GPU-to-GPU peer access, over
# PCIe or NVLink (NVIDIA's MIG user guide), so two of them on NVLinked GPUs do not talk over NVLink.
NVLINK_KINDS = frozenset(DEVICE_TYPES)
MIG_CAPACITIES = ("multiprocessors", "copyEngines", "decoders", "encoders", "jpegEngines", "ofaEngines")
MAX_STRING = 64  # resource.k8s.io's limit on a string or version attribute


def semver(value: str) -> str | None:
    """``580.95.05`` -> ``580.95.5``; None for what has no numeric major version."""
    parts = value.strip().split(".")
    if not parts or len(parts) > 3 or not all(p.isdigit() for p in parts):
        return None
    numbers = [int(p) for p in parts] + [0] * (3 - len(parts))
    return ".".join(str(n) for n in numbers)


@dataclass(frozen=True)
class GpuFacts:
    """What every device of one GPU repeats beyond gpuslice's own attributes, as published
    (versions in semver, empty where unknown)."""

    brand: str = ""
    architecture: str = ""
    compute_capability: str = ""
    driver_version: str = ""
    cuda_driver_version: str = ""
    minor: int | None = None
    pcie_root: str | None = None
    numa_node: int | None = None
    nvlink_domain: str | None = None

    @classmethod
    def of(cls, gpu: Gpu) -> GpuFacts:
        return cls(gpu.brand, gpu.architecture, semver(gpu.compute_capability) or "",
                   semver(gpu.driver_version) or "", semver(gpu.cuda_driver_version) or "", gpu.minor, gpu.pcie_root,
                   gpu.numa_node, gpu.nvlink_domain)


def _string(value: str) -> dict[str, str]:
    return {"string": value[:MAX_STRING]}


def nvidia_attributes(kind: str, uuid: str, index: int, product: str, pci_bus_id: str, facts: GpuFacts,
                      profile: str | None) -> dict[str, Any]:
    """The attributes NVIDIA's driver gives a device of this kind (``full``, ``shared``, ``slice``
    or a MIG profile's name), with the standard PCI ones."""
    whole = kind in ("full", "shared")
    found: dict[str, Any] = {
        "type": _string(DEVICE_TYPES.get(kind, "mig")),
        "uuid" if whole else "parentUUID": _string(uuid),
        "productName": _string(product),
        "index": {"int": index},
        PCI_BUS_ID_ATTRIBUTE: _string(pci_bus_id),
    }
    for name, value in (("brand", facts.brand), ("architecture", facts.architecture)):
        if value:
            found[name] = _string(value)
    for name, version in (("cudaComputeCapability", facts.compute_capability),
                          ("driverVersion", facts.driver_version), ("cudaDriverVersion", facts.cuda_driver_version)):
        if version:
            found[name] = {"version": version}
    if facts.minor is not None:
        found["minor"] = {"int": facts.minor}
    if facts.pcie_root:
        found[PCIE_ROOT_ATTRIBUTE] = _string(facts.pcie_root)
    if profile is not None:
        found["profile"] = _string(profile)
    return found


def topology_attributes(kind: str, facts: GpuFacts) -> dict[str, Any]:
    """Where the device's GPU sits beyond its PCIe root (``inventory.topology``): its NUMA node on
    every device of it, its NVLink domain on those that can use NVLink (not a MIG instance)."""
    found: dict[str, Any] = {}
    if facts.numa_node is not None and facts.numa_node >= 0:
        found[NUMA_NODE_ATTRIBUTE] = {"int": facts.numa_node}
    if facts.nvlink_domain and kind in NVLINK_KINDS:
        found[NVLINK_DOMAIN_ATTRIBUTE] = _string(facts.nvlink_domain)
    return found


def mig_capacities(engines: Engines | None) -> dict[str, Any]:
    return {name: {"value": str(count)} for name, count in engines.capacities()} if engines else {}


def read_facts(attributes: Mapping[str, Any]) -> GpuFacts:
    """The facts back from published attributes (what ``nvidia_attributes`` wrote)."""

    def value(name: str, kind: str) -> Any:
        return (attributes.get(name) or {}).get(kind)

    minor, root = value("minor", "int"), value(PCIE_ROOT_ATTRIBUTE, "string")
    numa, nvlink = value(NUMA_NODE_ATTRIBUTE, "int"), value(NVLINK_DOMAIN_ATTRIBUTE, "string")
    return GpuFacts(str(value("brand", "string") or ""), str(value("architecture", "string") or ""),
                    str(value("cudaComputeCapability", "version") or ""), str(value("driverVersion", "version") or ""),
                    str(value("cudaDriverVersion", "version") or ""), minor if isinstance(minor, int) else None,
                    root if isinstance(root, str) else None, numa if isinstance(numa, int) else None,
                    nvlink if isinstance(nvlink, str) else None)


def read_engines(capacity: Mapping[str, Any]) -> Engines | None:
    if not all(name in capacity for name in MIG_CAPACITIES):
        return None
    try:
        counts = [int(str((capacity[name] or {}).get("value", ""))) for name in MIG_CAPACITIES]
    except ValueError:
        return None
    return Engines(*counts)
