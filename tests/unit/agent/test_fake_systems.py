"""Fake nodes with real layouts (inventory.systems): where each GPU sits, published on every device of it,
and `gpuslice plan` showing it."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuslice.agent.gpus import GpuBackendError
from gpuslice.agent.gpus.fake import FakeBackend, parse_fake_gpus
from gpuslice.devcluster.nodes import fake_gpu_node
from gpuslice.inventory.nodes import node_gpus
from gpuslice.inventory.systems import SYSTEMS
from gpuslice.inventory.topology import NUMA_NODE_ATTRIBUTE, NVLINK_DOMAIN_ATTRIBUTE
from gpuslice.preview import preview

NUMA, ROOT, NVLINK = NUMA_NODE_ATTRIBUTE, "resource.kubernetes.io/pcieRoot", NVLINK_DOMAIN_ATTRIBUTE


def discover(system: str, tmp_path: Path) -> list[Any]:
    return FakeBackend("n", parse_fake_gpus(system), tmp_path).discover()


def test_a_dgx_h100_is_one_nvswitch_domain_two_numa_nodes_and_a_pcie_root_per_pair(tmp_path: Path) -> None:
    gpus = discover("dgx-h100", tmp_path)
    assert [g.product_name for g in gpus] == ["NVIDIA H100 80GB HBM3"] * 8
    assert len({g.nvlink_domain for g in gpus}) == 1
    assert gpus[0].nvlink_domain
    assert [g.numa_node for g in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    roots = [g.pcie_root for g in gpus]
    assert roots[0] == roots[1] != roots[2] == roots[3] != roots[4] == roots[5] != roots[6] == roots[7]
    nics = SYSTEMS["dgx-h100"].nics
    assert Counter(n.root for n in nics) == Counter(roots), "each pair's PCIe switch holds their two NICs"


def test_h100_nvl_pairs_and_l40s_without_nvlink(tmp_path: Path) -> None:
    nvl = discover("h100-nvl", tmp_path / "a")
    assert [g.nvlink_domain for g in nvl][::2] == [g.nvlink_domain for g in nvl][1::2]
    assert len({g.nvlink_domain for g in nvl}) == 4
    assert [g.numa_node for g in nvl] == [0] * 4 + [1] * 4
    l40s = discover("pcie-l40s", tmp_path / "b")
    assert [g.product_name for g in l40s] == ["NVIDIA L40S"] * 8
    assert {g.nvlink_domain for g in l40s} == {None}
    assert [g.numa_node for g in l40s] == [0] * 4 + [1] * 4


def test_gpus_without_a_system_have_no_numa_node_or_nvlink_domain(tmp_path: Path) -> None:
    gpus = discover("h100-80gb:8", tmp_path)
    assert {(g.numa_node, g.nvlink_domain) for g in gpus} == {(None, None)}, "not known, so not guessed"


@pytest.mark.parametrize(("text", "said"), [
    ("dgx-h100,l4:1", "give it alone"), ("dgx-h100:4", "has 8 GPUs"), ("dgx-h100:8:mig-maybe", "unknown option")])
def test_a_system_is_a_whole_node(text: str, said: str) -> None:
    with pytest.raises(GpuBackendError, match=said):
        parse_fake_gpus(text)


def test_a_system_node_says_its_gpus_in_its_labels() -> None:
    node = fake_gpu_node("n", "l4", 1, system="h100-nvl")
    found = node_gpus("n", node["metadata"]["labels"])
    assert found is not None
    assert (found.product_name, found.count) == ("NVIDIA H100 NVL", 8)


POLICIES = [
    {"apiVersion": "gpuslice.dev/v1alpha1", "kind": "GpuSlicePolicy", "metadata": {"name": "train"},
     "spec": {"nodeSelector": {"matchLabels": {"pool": "train"}},
              "slicing": {"mode": "memory", "sliceSize": "20Gi", "allowFullGpu": True}}},
    {"apiVersion": "gpuslice.dev/v1alpha1", "kind": "GpuSlicePolicy", "metadata": {"name": "share"},
     "spec": {"nodeSelector": {"matchLabels": {"pool": "share"}}, "slicing": {"mode": "shared", "sliceSize": "10Gi"}}},
    {"apiVersion": "gpuslice.dev/v1alpha1", "kind": "GpuSlicePolicy", "metadata": {"name": "mig"},
     "spec": {"nodeSelector": {"matchLabels": {"pool": "mig"}},
              "slicing": {"mode": "mig", "mig": {"profiles": ["1g.10gb", "3g.40gb"]}}}},
]


def planned(tmp_path: Path, pool: str) -> tuple[str, list[dict[str, Any]]]:
    path = tmp_path / "policies.yaml"
    path.write_text(yaml.safe_dump_all(POLICIES))
    text = preview([path], "dgx-h100", "dgx-1", {"pool": pool})
    devices = [d for doc in yaml.safe_load_all(text) if doc for d in doc["spec"].get("devices") or []]
    return text, devices


@pytest.mark.parametrize("pool", ["train", "share"])
def test_plan_on_a_dgx_h100_shows_numa_pcie_root_and_nvlink_domain_on_every_device(tmp_path: Path, pool: str) -> None:
    text, devices = planned(tmp_path, pool)
    assert devices
    for device in devices:
        attributes = device["attributes"]
        assert {NUMA, ROOT, NVLINK} <= set(attributes), device["name"]
        assert attributes[NUMA]["int"] in (0, 1)
        assert len(attributes) + len(device["capacity"]) <= 32, "the API's limit per device"
    assert re.search(r"#   GPU 4: \d devices? \(NUMA node 1, PCIe root pci0000:97, NVLink domain nvswitch-", text)


def test_a_mig_instance_carries_numa_and_pcie_root_but_no_nvlink_domain(tmp_path: Path) -> None:
    """A MIG instance has no GPU-to-GPU peer access (NVIDIA's MIG user guide): two on NVLinked GPUs
    do not talk over NVLink, so aligning them on an NVLink domain would promise what is not there."""
    _, devices = planned(tmp_path, "mig")
    assert devices
    for device in devices:
        attributes = device["attributes"]
        assert {NUMA, ROOT} <= set(attributes), device["name"]
        assert NVLINK not in attributes, device["name"]
        assert len(attributes) + len(device["capacity"]) <= 32, "the API's limit per device"
