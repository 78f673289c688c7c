"""Where a GPU sits: its NUMA node, PCIe root and NVLink domain, and the attributes that say so (pure).

``resource.kubernetes.io/numaNode`` is Kubernetes' standard attribute
(``k8s.io/dynamic-resource-allocation/deviceattribute``, ``StandardDeviceAttributeNUMANode``, from
v0.37): the NUMA node of the device's PCI function as the kernel says (``numa_node`` in sysfs), an
int; a device with no NUMA affinity (``-1``) must not publish it, since ``-1`` would match every
other such device. NVIDIA's DRA driver publishes the same (``cmd/gpu-kubelet-plugin/numa.go``).

Upstream has no name for an NVLink domain (NVIDIA's driver publishes none for a node's NVLink:
its ``clique`` is the multi-node NVLink of ComputeDomains, and ``partition<N>`` needs Fabric
Manager partitioning), so it is gpuslice's own: ``gpuslice.dev/nvlinkDomain``, a string that
GPUs connected all-to-all by NVLink share (one NVSwitch fabric, a bridged pair). Like
``pcieRoot`` and ``numaNode`` its value means something within one node only.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from gpuslice.inventory.pci import PCIE_ROOT_ATTRIBUTE

NUMA_NODE_ATTRIBUTE = "resource.kubernetes.io/numaNode"
NVLINK_DOMAIN_ATTRIBUTE = "gpuslice.dev/nvlinkDomain"  # dra.names.ATTRIBUTE_DOMAIN (a test holds them equal)

Alignment = Literal["NVLink", "NUMANode", "PCIeRoot"]
ALIGNMENTS: tuple[Alignment, ...] = ("NVLink", "NUMANode", "PCIeRoot")  # also the order names are made in
ALIGNMENT_ATTRIBUTES: dict[Alignment, str] = {"NVLink": NVLINK_DOMAIN_ATTRIBUTE, "NUMANode": NUMA_NODE_ATTRIBUTE,
                                              "PCIeRoot": PCIE_ROOT_ATTRIBUTE}
ALIGNMENT_WORDS: dict[Alignment, str] = {"NVLink": "nvlink", "NUMANode": "numa", "PCIeRoot": "pcie"}
ALIGNMENT_PHRASES: dict[Alignment, str] = {"NVLink": "an NVLink domain", "NUMANode": "a NUMA node",
                                           "PCIeRoot": "a PCIe root"}
UNALIGNED = "any"  # the name of an alignment of nothing: any devices of the node


def alignment_name(levels: Sequence[Alignment]) -> str:
    """``nvlink-numa``: the name of the subrequest (and metric label) of an alignment, its levels in
    the canonical order whatever order they were given in; ``any`` for none."""
    return "-".join(ALIGNMENT_WORDS[a] for a in ALIGNMENTS if a in levels) or UNALIGNED


def alignment_phrase(levels: Sequence[Alignment]) -> str:
    """``share an NVLink domain and a NUMA node``: what the devices of an alignment have in common."""
    parts = [ALIGNMENT_PHRASES[a] for a in ALIGNMENTS if a in levels]
    if not parts:
        return "need share nothing"
    return "share " + (" and ".join(parts) if len(parts) < 3 else f"{parts[0]}, {parts[1]} and {parts[2]}")


LinkKind = Literal["gpu", "switch", "unknown"]


@dataclass(frozen=True)
class NvLink:
    """One active NVLink of a GPU: the PCI bus id of what is at its far end (another GPU, an NVSwitch)
    and what that is; ``unknown`` where NVML does not say (its answer is then read by the bus id)."""

    remote: str
    kind: LinkKind = "unknown"


def nvlink_domains(links: Mapping[str, Sequence[NvLink] | None]) -> dict[str, str]:
    """Each GPU's NVLink domain, by PCI bus id: the GPUs NVLink connects all-to-all.

    ``links``: every GPU of the node (bus id) -> its active links, or None where they could not be
    read (that GPU gets no domain, and is no member of another's). Two GPUs are joined by a direct
    link or by an NVSwitch both link to; a set so joined is a domain only if every pair of its GPUs
    is (a ring or a hybrid cube mesh is not all-to-all, so it has none). A GPU alone has none.
    Named after what makes it: ``nvswitch-<the lowest switch's bus id>`` or ``nvlink-<the lowest
    GPU's bus id>``, so a domain keeps its name while its switches stay.
    """
    known = {gpu: tuple(found) for gpu, found in links.items() if found is not None}
    neighbours: dict[str, set[str]] = {gpu: set() for gpu in known}
    switches: dict[str, set[str]] = {gpu: set() for gpu in known}
    unclear: set[str] = set()
    for gpu, found in known.items():
        for link in found:
            if link.remote in links and link.kind in ("gpu", "unknown"):
                if link.remote in known:
                    neighbours[gpu].add(link.remote)
                    neighbours[link.remote].add(gpu)
            elif link.kind == "switch" and _bus_id(link.remote):
                switches[gpu].add(link.remote)
            else:
                unclear.add(gpu)  # a link to something NVML cannot name: the GPU's domain is not known
    members = [gpu for gpu in known if gpu not in unclear]
    parent = {gpu: gpu for gpu in members}

    def root(gpu: str) -> str:
        while parent[gpu] != gpu:
            parent[gpu] = parent[parent[gpu]]
            gpu = parent[gpu]
        return gpu

    def joined(a: str, b: str) -> bool:
        return b in neighbours[a] or bool(switches[a] & switches[b])

    for a, b in itertools.combinations(members, 2):
        if joined(a, b):
            parent[root(a)] = root(b)
    groups: dict[str, list[str]] = {}
    for gpu in members:
        groups.setdefault(root(gpu), []).append(gpu)
    found_domains: dict[str, str] = {}
    for group in groups.values():
        if len(group) < 2 or not all(joined(a, b) for a, b in itertools.combinations(group, 2)):
            continue
        fabric = sorted(set().union(*(switches[g] for g in group)))
        name = f"nvswitch-{fabric[0]}" if fabric else f"nvlink-{min(group)}"
        found_domains.update({gpu: name for gpu in group})
    return found_domains


def _bus_id(value: str) -> bool:
    """A bus id NVML filled in (it answers zeros for a far end it does not know)."""
    return bool(value) and value.strip("0:.") != ""
