"""PCI addresses as Kubernetes' standard device attributes want them (pure).

``resource.kubernetes.io/pciBusID`` is the extended BDF in lowercase with a four-digit domain
(``0000:3b:00.0``): ``k8s.io/dynamic-resource-allocation/deviceattribute`` (``pci_linux.go``,
``verifyPCIBDFFormat``) refuses anything else, and NVIDIA's driver gets there through go-nvlib's
``GetPCIBusID`` (``pkg/nvlib/device/device.go``: lowercase, then drop the first ``0000`` of an
eight-digit domain). NVML itself answers ``00000000:3B:00.0``.

``resource.kubernetes.io/pcieRoot`` is the first directory under ``/sys/devices`` of the
device's sysfs path (``pci0000:3a``), found through the ``/sys/bus/pci/devices/<bdf>`` link
(``deviceattribute.resolvePCIeRoot``); a GPU and a NIC under one root share it, which is what
``matchAttribute`` aligns on.
"""

from __future__ import annotations

import posixpath
import re

from gpuslice.errors import GpusliceError

PCI_BUS_ID_ATTRIBUTE = "resource.kubernetes.io/pciBusID"
PCIE_ROOT_ATTRIBUTE = "resource.kubernetes.io/pcieRoot"
# deviceattribute's verifyPCIBDFFormat, as is.
BDF = re.compile(r"^([0-9a-f]{4}):([0-9a-f]{2}):([0-9a-f]{2})\.([0-9a-f]{1})$")
_EIGHT_DIGIT_DOMAIN = re.compile(r"^0{4}[0-9a-f]{4}:")  # go-nvlib's pciBusIDPrefixRE


class PciAddressError(GpusliceError, ValueError):
    pass


def normalized_bus_id(raw: str) -> str:
    """NVML's ``00000000:3B:00.0`` (or any case, or a 4-digit domain) as ``0000:3b:00.0``."""
    bus_id = raw.strip().rstrip("\x00").lower()
    if _EIGHT_DIGIT_DOMAIN.match(bus_id):
        bus_id = bus_id[4:]
    if not BDF.match(bus_id):
        raise PciAddressError(f"PCI bus id {raw!r} is not an extended BDF (domain:bus:device.function)")
    return bus_id


def pcie_root(bus_id: str, link_target: str) -> str:
    """The PCIe root of ``bus_id`` from where ``/sys/bus/pci/devices/<bus_id>`` links to (a path
    relative to that directory, as sysfs writes it, or absolute)."""
    here = "/sys/bus/pci/devices"
    target = posixpath.normpath(link_target if posixpath.isabs(link_target) else posixpath.join(here, link_target))
    prefix = "/sys/devices/"
    parts = target[len(prefix):].split("/") if target.startswith(prefix) else []
    if not parts or not parts[0].startswith("pci") or parts[-1] != bus_id:
        raise PciAddressError(f"{here}/{bus_id} links to {link_target!r}, not to a device under /sys/devices/pci*")
    return parts[0]
