"""The controller's inventory from GPU Feature Discovery's labels, per MIG strategy.

The label sets are what NVIDIA/k8s-device-plugin's ``internal/lm`` writes (``resource.go``,
``mig-strategy.go``, and the expectations of ``mig-strategy_test.go``), filled in with the figures
NVML reports for these GPUs: the product is NVML's name sanitised, memory is in MiB, MIG device
attributes come from ``nvmlGpuInstanceProfileInfo_t``.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuslice.agent.gpus.fake import FakeBackend
from gpuslice.inventory.catalog import MODELS
from gpuslice.inventory.nodes import node_gpus, product_key
from gpuslice.planning.node.node_pool import plan_node_pool
from gpuslice.planning.selection import select
from gpuslice.planning.validation import validate
from tests.builders import policy_model

CUDA = {"nvidia.com/cuda.driver-version.full": "580.95.05", "nvidia.com/cuda.driver-version.major": "580",
        "nvidia.com/cuda.runtime-version.full": "13.0", "nvidia.com/gpu.present": "true"}

# mig.strategy none (GFD's default), 8 H100s: no nvidia.com/mig.strategy label at all.
NONE = {**CUDA, "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.memory": "81559", "nvidia.com/gpu.replicas": "1", "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/gpu.family": "hopper", "nvidia.com/gpu.compute.major": "9", "nvidia.com/gpu.compute.minor": "0",
        "nvidia.com/mig.capable": "true"}
# The device plugin time-slicing the GPUs (replicas 4): the product gets -SHARED.
TIME_SLICED = {**NONE, "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-SHARED", "nvidia.com/gpu.replicas": "4",
               "nvidia.com/gpu.sharing-strategy": "time-slicing"}
MIG_ONE_G = {"multiprocessors": "14", "slices.gi": "1", "slices.ci": "1", "engines.copy": "1", "engines.decoder": "0",
             "engines.encoder": "0", "engines.jpeg": "0", "engines.ofa": "0"}
# mig.strategy mixed, 4 A100 40GB, each in MIG mode with 7 x 1g.5gb: the full-GPU labels stay the
# GPUs' (replicas 0: a MIG-enabled GPU is not shared), each profile gets nvidia.com/mig-<profile>.*.
MIXED = {**CUDA, "nvidia.com/mig.strategy": "mixed", "nvidia.com/mig.capable": "true",
         "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "nvidia.com/gpu.count": "4",
         "nvidia.com/gpu.memory": "40960", "nvidia.com/gpu.replicas": "0", "nvidia.com/gpu.sharing-strategy": "none",
         "nvidia.com/mig-1g.5gb.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "nvidia.com/mig-1g.5gb.count": "28",
         "nvidia.com/mig-1g.5gb.memory": "4864", "nvidia.com/mig-1g.5gb.replicas": "1",
         **{f"nvidia.com/mig-1g.5gb.{k}": v for k, v in MIG_ONE_G.items()}}
# mig.strategy single (the GPU Operator's default), the same node: the MIG devices' labels win.
SINGLE = {**CUDA, "nvidia.com/mig.strategy": "single", "nvidia.com/mig.capable": "true",
          "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "nvidia.com/gpu.count": "28",
          "nvidia.com/gpu.memory": "4864", "nvidia.com/gpu.replicas": "1", "nvidia.com/gpu.sharing-strategy": "none",
          **{f"nvidia.com/gpu.{k}": v for k, v in MIG_ONE_G.items()}}
# single, on a layout GFD cannot label (two profiles, or a MIG GPU without instances).
SINGLE_INVALID = {**CUDA, "nvidia.com/mig.strategy": "single", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-INVALID",
                  "nvidia.com/gpu.count": "0", "nvidia.com/gpu.memory": "0", "nvidia.com/gpu.replicas": "0",
                  "nvidia.com/gpu.sharing-strategy": ""}
# A model the catalog does not know (NVML: "NVIDIA H100 PCIe", 81,559 MiB), two of them.
UNKNOWN = {**NONE, "nvidia.com/gpu.product": "NVIDIA-H100-PCIe", "nvidia.com/gpu.count": "2", "nvidia.com/gpu.memory": "81559"}
UNKNOWN_SINGLE = {**SINGLE, "nvidia.com/gpu.product": "NVIDIA-H100-PCIe-MIG-1g.10gb", "nvidia.com/gpu.memory": "9984"}


def test_strategy_none_describes_the_gpus() -> None:
    gpus = node_gpus("n", NONE)
    assert gpus is not None
    assert (gpus.product_name, gpus.memory, gpus.count, gpus.model) == (
        "NVIDIA H100 80GB HBM3", 81559 * 1024**2, 8, MODELS["h100-80gb"])


def test_time_slicing_is_the_same_product() -> None:
    assert node_gpus("n", TIME_SLICED) == node_gpus("n", NONE)


def test_strategy_mixed_reads_the_full_gpu_labels_not_the_mig_devices() -> None:
    gpus = node_gpus("n", MIXED)
    assert gpus is not None
    assert (gpus.product_name, gpus.memory, gpus.count, gpus.mig_devices) == (
        "NVIDIA A100-SXM4-40GB", 40960 * 1024**2, 4, None)


def test_strategy_single_is_never_read_as_gpus_of_a_mig_devices_size() -> None:
    gpus = node_gpus("n", SINGLE)
    assert gpus is not None
    assert gpus.product_name == "NVIDIA A100-SXM4-40GB", "the model, without -MIG-1g.5gb"
    assert gpus.memory == MODELS["a100-40gb"].memory, "the GPU's memory, from the catalog, not one 1g.5gb's"
    assert gpus.count is None, "the labels count MIG devices, not GPUs"
    assert gpus.mig_devices == "28 x 1g.5gb of 4864 MiB"
    # A 10Gi memory policy fits an A100 40GB; judged against seven 4.75 GiB "GPUs" it would not.
    memory = policy_model("m", {"mode": "memory", "sliceSize": "10Gi"}, "2026-12-01T10:00:00Z")
    selection = select(memory, [(SINGLE, gpus)])
    assert (selection.node_count, selection.gpu_count) == (1, 0)
    assert validate(memory, selection, []) == []
    invalid = node_gpus("n", SINGLE_INVALID)
    assert invalid is not None
    assert (invalid.product_name, invalid.count, invalid.mig_devices) == (
        "NVIDIA A100-SXM4-40GB", None, "none GFD can label (MIG-INVALID)")


def test_an_uncatalogued_gpu_under_single_has_no_size_to_judge() -> None:
    gpus = node_gpus("n", UNKNOWN_SINGLE)
    assert gpus is not None
    assert (gpus.product_name, gpus.memory, gpus.count, gpus.model) == ("NVIDIA-H100-PCIe", None, None, None)
    big = policy_model("m", {"mode": "memory", "sliceSize": "60Gi"}, "2026-12-01T10:00:00Z")
    assert validate(big, select(big, [(UNKNOWN_SINGLE, gpus)]), []) == [], "its agent judges it from NVML"


@pytest.mark.parametrize("spelling", ["NVIDIA H100 PCIe", "NVIDIA-H100-PCIe"])
def test_one_product_whichever_spelling_on_both_sides(spelling: str) -> None:
    """The controller (GFD's label) and the agent (NVML's name) select the same GPUs for a model the
    catalog does not know, whichever spelling the policy uses."""
    gpus = node_gpus("n", UNKNOWN)
    assert gpus is not None
    assert (gpus.product_name, gpus.memory, gpus.count) == ("NVIDIA-H100-PCIe", 81559 * 1024**2, 2)
    chosen = policy_model("p", {"mode": "shared", "sliceSize": "10Gi"}, "2026-12-01T10:00:00Z", gpuSelector={"products": [spelling]})
    assert select(chosen, [(UNKNOWN, gpus)]).gpu_count == 2
    [h100] = FakeBackend("n", [("h100-80gb", 1)]).discover()
    nvl = replace(h100, product_name="NVIDIA H100 PCIe")  # as NVML names it
    assert len(plan_node_pool({}, [nvl], [chosen]).devices) == 1
    assert product_key("NVIDIA H100 PCIe") == product_key("NVIDIA-H100-PCIe") == "NVIDIA-H100-PCIe"
    other = policy_model("q", {"mode": "shared", "sliceSize": "10Gi"}, "2026-12-01T10:00:00Z", gpuSelector={"products": ["NVIDIA H800 PCIe"]})
    assert select(other, [(UNKNOWN, gpus)]).gpu_count == 0
    assert plan_node_pool({}, [nvl], [other]).devices == []
