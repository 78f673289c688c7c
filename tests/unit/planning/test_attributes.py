"""NVIDIA's attribute names and value types on gpuslice's devices, and the standard PCI ones."""

from __future__ import annotations

from typing import Any

import pytest

from gpuslice.inventory.catalog import MODELS
from gpuslice.inventory.pci import BDF, PciAddressError, normalized_bus_id, pcie_root
from gpuslice.planning.attributes import semver
from gpuslice.planning.node.node_pool import plan_node_pool
from tests.builders import policy_model as policy
from tests.unit.planning.node.one_node import LABELS, gpus

MEMORY = policy("m", {"mode": "memory", "sliceSize": "10G", "allowFullGpu": True})
SHARED = policy("s", {"mode": "shared", "sliceSize": "10Gi"})
MIG = policy("g", {"mode": "mig", "mig": {"profiles": ["1g.10gb", "7g.80gb"]}})


@pytest.mark.parametrize(("raw", "standard"), [
    ("00000000:3B:00.0", "0000:3b:00.0"),  # NVML's nvmlPciInfo_t.busId
    ("0000:3B:00.0", "0000:3b:00.0"),  # NVML's busIdLegacy
    ("00000001:3b:00.1", "0001:3b:00.1"),  # go-nvlib drops only a leading 0000
    ("0000:3b:00.0", "0000:3b:00.0"),
])
def test_bus_ids_are_normalised_as_go_nvlib_does(raw: str, standard: str) -> None:
    assert normalized_bus_id(raw) == standard
    assert BDF.match(standard)


@pytest.mark.parametrize("raw", ["3B:00.0", "00000000:3B:00", "1:3b:00.0", ""])
def test_a_bus_id_that_is_no_bdf_is_refused(raw: str) -> None:
    with pytest.raises(PciAddressError):
        normalized_bus_id(raw)


def test_the_pcie_root_is_the_first_directory_under_sys_devices() -> None:
    link = "../../../devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0"
    assert pcie_root("0000:3b:00.0", link) == "pci0000:3a"
    assert pcie_root("0000:3b:00.0", "/sys/devices/pci0000:3a/0000:3b:00.0") == "pci0000:3a"
    with pytest.raises(PciAddressError):
        pcie_root("0000:3b:00.0", "../../../devices/pci0000:3a/0000:3c:00.0")  # another device
    with pytest.raises(PciAddressError):
        pcie_root("0000:3b:00.0", "../../../devices/platform/0000:3b:00.0")


@pytest.mark.parametrize(("raw", "version"), [("580.95.05", "580.95.5"), ("9.0", "9.0.0"), ("13.0", "13.0.0"),
                                               ("12", "12.0.0"), ("", None), ("575.57.08-beta", None)])
def test_versions_are_semver_as_nvidia_coerces_them(raw: str, version: str | None) -> None:
    assert semver(raw) == version


def _by_kind(devices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for device in devices:
        attributes = device["attributes"]
        kind = attributes["type"]["string"] + ("-" + attributes["profile"]["string"] if "profile" in attributes else "")
        found.setdefault(kind, device)
    return found


def test_every_device_has_nvidias_attributes_with_the_catalogs_values() -> None:
    [gpu] = gpus("h100-80gb")
    model = MODELS["h100-80gb"]
    devices = [*plan_node_pool(LABELS, [gpu], [MEMORY]).devices, *plan_node_pool(LABELS, [gpu], [SHARED]).devices,
               *plan_node_pool(LABELS, [gpu], [MIG]).devices]
    kinds = _by_kind(devices)
    assert set(kinds) == {"slice", "gpu", "mig-1g.10gb", "mig-7g.80gb"}
    for kind, device in kinds.items():
        attributes = device["attributes"]
        assert attributes["productName"] == {"string": model.product_name}
        assert attributes["brand"] == {"string": "Nvidia"}
        assert attributes["architecture"] == {"string": "Hopper"}
        assert attributes["cudaComputeCapability"] == {"version": "9.0.0"}
        assert attributes["driverVersion"] == {"version": "580.95.5"}, "NVML's 580.95.05, as semver"
        assert attributes["cudaDriverVersion"] == {"version": "13.0.0"}
        assert attributes["index"] == {"int": 0}
        assert attributes["minor"] == {"int": 0}
        assert attributes["resource.kubernetes.io/pciBusID"] == {"string": "0000:18:00.0"}
        assert attributes["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:17"}
        assert attributes["uuid" if kind == "gpu" else "parentUUID"] == {"string": gpu.uuid}, kind
        assert len(attributes) + len(device["capacity"]) <= 32, "the API's limit per device"
    one = kinds["mig-1g.10gb"]["capacity"]
    assert {k: v["value"] for k, v in one.items()} == {
        "memory": "9984Mi", "multiprocessors": "16", "copyEngines": "1", "decoders": "1", "encoders": "0",
        "jpegEngines": "1", "ofaEngines": "0"}
    assert kinds["mig-7g.80gb"]["capacity"]["multiprocessors"] == {"value": "132"}


def test_the_nvlink_domain_is_in_gpuslices_own_domain() -> None:
    from gpuslice.dra.names import ATTRIBUTE_DOMAIN
    from gpuslice.inventory.topology import NVLINK_DOMAIN_ATTRIBUTE

    assert NVLINK_DOMAIN_ATTRIBUTE.split("/")[0] == ATTRIBUTE_DOMAIN
