"""Where each GPU sits, read from NVML (and sysfs) under the real pynvml on the stand-in library: its
NUMA node, and the NVLink domain its links make; what NVML cannot say is left out, never guessed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from gpuslice.agent.gpus.nvml import NvmlBackend
from gpuslice.inventory.topology import NvLink, nvlink_domains
from tests.unit.agent.libnvml import WRITES, FakeLibNvml, installed
from tests.unit.agent.libnvml_topology import bridged, switched

SWITCHES = (0x05, 0x06, 0x07, 0x08)


def bus(number: int) -> str:
    return f"0000:{number:02x}:00.0"


def numa_files(sysfs: Path, nodes: dict[int, int]) -> Path:
    for number, node in nodes.items():
        (sysfs / "bus/pci/devices" / bus(number)).mkdir(parents=True)
        (sysfs / "bus/pci/devices" / bus(number) / "numa_node").write_text(f"{node}\n")
    return sysfs


@pytest.fixture
def dgx() -> Iterator[FakeLibNvml]:
    """Eight H100 on four NVSwitches, as an HGX board (bus numbers 0x18, 0x28, ...)."""
    lib = FakeLibNvml([("h100-80gb", False)] * 8)
    for gpu in lib.gpus:
        gpu.links = switched(SWITCHES)
    with installed(lib):
        yield lib


def test_an_nvswitch_board_is_one_domain_and_numa_comes_from_sysfs(dgx: FakeLibNvml, tmp_path: Path) -> None:
    sysfs = numa_files(tmp_path, {g.bus: i // 4 for i, g in enumerate(dgx.gpus)})
    gpus = NvmlBackend(pynvml, sysfs=sysfs).discover()
    assert {g.nvlink_domain for g in gpus} == {"nvswitch-0000:05:00.0"}
    assert [g.numa_node for g in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert not set(dgx.calls) & WRITES, "discovery changes nothing"


def test_bridged_pairs_are_domains_of_two() -> None:
    lib = FakeLibNvml([("h100-80gb", False)] * 4)
    for i, gpu in enumerate(lib.gpus):
        gpu.links = [*bridged(lib.gpus[i ^ 1].bus), None, None]  # two links of the bridge are down
    with installed(lib):
        gpus = NvmlBackend(pynvml, sysfs=Path("/nonexistent")).discover()
    assert [g.nvlink_domain for g in gpus] == ["nvlink-0000:18:00.0", "nvlink-0000:18:00.0",
                                              "nvlink-0000:38:00.0", "nvlink-0000:38:00.0"]


def test_no_nvlink_no_domain_and_numa_from_nvmls_affinity_where_sysfs_is_silent() -> None:
    lib = FakeLibNvml([("l40s", False)] * 3)
    lib.gpus[0].affinity = (1,)
    lib.gpus[1].affinity = (0, 1)  # two nodes: which one is not known
    with installed(lib):
        gpus = NvmlBackend(pynvml, sysfs=Path("/nonexistent")).discover()
    assert [g.nvlink_domain for g in gpus] == [None, None, None]
    assert [g.numa_node for g in gpus] == [1, None, None]


def test_no_numa_affinity_in_sysfs_is_no_attribute(tmp_path: Path) -> None:
    lib = FakeLibNvml([("l40s", False)])
    lib.gpus[0].affinity = (0,)
    with installed(lib):
        gpus = NvmlBackend(pynvml, sysfs=numa_files(tmp_path, {lib.gpus[0].bus: -1})).discover()
    assert gpus[0].numa_node is None, "the kernel says no affinity: NVML is not asked to guess"


def test_a_link_nvml_cannot_describe_leaves_that_gpu_out(dgx: FakeLibNvml) -> None:
    dgx.gpus[3].unreadable_links = frozenset({7})
    gpus = NvmlBackend(pynvml, sysfs=Path("/nonexistent")).discover()
    assert gpus[3].nvlink_domain is None
    assert {g.nvlink_domain for i, g in enumerate(gpus) if i != 3} == {"nvswitch-0000:05:00.0"}


def test_an_older_driver_without_the_remote_type_tells_gpus_by_bus_and_switches_not_at_all(
        dgx: FakeLibNvml) -> None:
    dgx.missing.add("nvmlDeviceGetNvLinkRemoteDeviceType")
    assert {g.nvlink_domain for g in NvmlBackend(pynvml, sysfs=Path("/nonexistent")).discover()} == {None}
    lib = FakeLibNvml([("h100-80gb", False)] * 2)
    lib.missing.add("nvmlDeviceGetNvLinkRemoteDeviceType")
    lib.gpus[0].links, lib.gpus[1].links = bridged(lib.gpus[1].bus), bridged(lib.gpus[0].bus)
    with installed(lib):
        assert {g.nvlink_domain for g in NvmlBackend(pynvml, sysfs=Path("/nonexistent")).discover()} == {
            "nvlink-0000:18:00.0"}


def test_an_nvlink_ring_is_not_all_to_all() -> None:
    """Four GPUs each linked to the next (a ring, or DGX-1's hybrid cube mesh in small): joined, but
    not all-to-all, so no domain."""
    ring = {bus(n): [NvLink(bus(m), "gpu") for m in (0x10 + (i + 1) % 4, 0x10 + (i - 1) % 4)]
            for i, n in enumerate(range(0x10, 0x14))}
    assert nvlink_domains(ring) == {}
    ring[bus(0x10)].append(NvLink(bus(0x12), "gpu"))
    ring[bus(0x11)].append(NvLink(bus(0x13), "gpu"))
    assert set(nvlink_domains(ring).values()) == {"nvlink-0000:10:00.0"}, "fully meshed now"


def test_a_gpu_whose_links_are_unknown_is_in_no_domain_and_no_switch_joins_through_it() -> None:
    links: dict[str, list[NvLink] | None] = {bus(0x10): [NvLink(bus(0x05), "switch")], bus(0x11): None,
                                             bus(0x12): [NvLink(bus(0x06), "switch")]}
    assert nvlink_domains(links) == {}, "two GPUs on different switches, the one between unknown"
    links[bus(0x14)] = [NvLink(bus(0x05), "switch")]
    assert nvlink_domains(links) == {bus(0x10): "nvswitch-0000:05:00.0", bus(0x14): "nvswitch-0000:05:00.0"}
    links[bus(0x13)] = [NvLink(bus(0x05), "switch"), NvLink("0000:00:00.0", "switch")]
    assert bus(0x13) not in nvlink_domains(links), "a switch NVML answers zeros for: not known"


def test_gpu_links_to_a_gpu_nvml_does_not_list_are_not_known() -> None:
    assert nvlink_domains({bus(0x10): [NvLink(bus(0x99), "gpu")]}) == {}
    assert nvlink_domains({bus(0x10): [NvLink(bus(0x11), "gpu")], bus(0x11): []}) == {
        bus(0x10): "nvlink-0000:10:00.0", bus(0x11): "nvlink-0000:10:00.0"}, "one side's links are enough"
