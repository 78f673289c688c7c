"""Whole servers for fake nodes: their GPUs with the NUMA node, PCIe root and NVLinks of each, and
their NICs (pure).

A fake node of plain ``MODEL:COUNT`` GPUs has no known layout, so it publishes no NUMA node and no
NVLink domain (never a guess); a node given one of these systems publishes the layout's. What is
real is each system's shape; the PCI bus numbers are made up (consistently: every device below its
root's bus), except the DGX H100's GPUs, whose bus ids are those its ``nvidia-smi`` shows.

- ``dgx-h100``: NVIDIA DGX H100. 8 H100 SXM5 on four NVSwitches (NVLink all-to-all, ``NV18`` in
  ``nvidia-smi topo -m``); two CPU sockets, GPUs 0-3 on NUMA node 0 and 4-7 on 1; a PCIe switch per
  two GPUs, which also holds their two ConnectX-7 NICs (one per GPU), so a GPU, its pair and their
  NICs share a PCIe root.
- ``pcie-l40s``: a two-socket PCIe server with 8 L40S, 4 per NUMA node, no NVLink (the L40S has
  none); a PCIe switch per two GPUs with one NIC.
- ``h100-nvl``: a two-socket PCIe server with 8 H100 NVL, bridged in pairs (NVLink bridge, ``NV12``:
  12 links per GPU), 4 per NUMA node, each GPU on a root port of its own, one NIC per NUMA node.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuslice.inventory.topology import NvLink, nvlink_domains


@dataclass(frozen=True)
class GpuSlot:
    bus: str  # the GPU's PCI bus id, 0000:18:00.0
    numa: int
    root: str  # its PCIe root, pci0000:15
    links: tuple[NvLink, ...] = ()  # its active NVLinks


@dataclass(frozen=True)
class Nic:
    """A NIC of the server, for another DRA driver's devices (an SR-IOV or RDMA one) to publish."""

    name: str
    bus: str
    numa: int
    root: str


@dataclass(frozen=True)
class SystemLayout:
    key: str
    title: str
    model: str  # the catalog's key for its GPUs
    gpus: tuple[GpuSlot, ...]
    nics: tuple[Nic, ...] = ()

    def nvlink_domains(self) -> dict[str, str]:
        """Each GPU's NVLink domain by bus id, worked out from the links as the NVML backend does."""
        return nvlink_domains({g.bus: g.links for g in self.gpus})


def _bus(number: int) -> str:
    return f"0000:{number:02x}:00.0"


def _root(number: int) -> str:
    return f"pci0000:{number:02x}"


def _dgx_h100() -> SystemLayout:
    gpu_buses = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
    switches = tuple(_bus(n) for n in (0x05, 0x06, 0x07, 0x08))
    roots = (0x15, 0x37, 0x97, 0xB7)  # one PCIe switch per pair, on a root port of its own root complex
    # 18 links per GPU over the four NVSwitches (5, 4, 4, 5).
    spread = (0,) * 5 + (1,) * 4 + (2,) * 4 + (3,) * 5
    gpus = tuple(GpuSlot(_bus(b), i // 4, _root(roots[i // 2]), tuple(NvLink(switches[s], "switch") for s in spread))
                 for i, b in enumerate(gpu_buses))
    nics = tuple(Nic(f"nic-{i}", _bus(b + 2), i // 4, _root(roots[i // 2])) for i, b in enumerate(gpu_buses))
    return SystemLayout("dgx-h100", "NVIDIA DGX H100 (8 x H100 SXM5, NVSwitch, 2 NUMA nodes)", "h100-80gb",
                        gpus, nics)


def _pcie_l40s() -> SystemLayout:
    roots = (0x10, 0x30, 0x90, 0xB0)
    gpus = tuple(GpuSlot(_bus(roots[i // 2] + 3 + 2 * (i % 2)), i // 4, _root(roots[i // 2])) for i in range(8))
    nics = tuple(Nic(f"nic-{p}", _bus(r + 1), p // 2, _root(r)) for p, r in enumerate(roots))
    return SystemLayout("pcie-l40s", "PCIe server (8 x L40S, no NVLink, 2 NUMA nodes)", "l40s", gpus, nics)


def _h100_nvl() -> SystemLayout:
    buses = (0x18, 0x28, 0x38, 0x48, 0x98, 0xA8, 0xB8, 0xC8)  # each on a root port of its own

    def partner(i: int) -> str:
        return _bus(buses[i ^ 1])

    gpus = tuple(GpuSlot(_bus(b), i // 4, _root(b - 1), tuple(NvLink(partner(i), "gpu") for _ in range(12)))
                 for i, b in enumerate(buses))
    nics = (Nic("nic-0", _bus(0x58), 0, _root(0x57)), Nic("nic-1", _bus(0xD8), 1, _root(0xD7)))
    return SystemLayout("h100-nvl", "PCIe server (8 x H100 NVL, NVLink-bridged pairs, 2 NUMA nodes)", "h100-nvl",
                        gpus, nics)


SYSTEMS: dict[str, SystemLayout] = {s.key: s for s in (_dgx_h100(), _pcie_l40s(), _h100_nvl())}
