"""A device plugin on the node: told by its NVIDIA resources in the Node's allocatable, whatever the
labels say; every GPU of the node is the plugin's, and each policy selecting one is told why."""

from __future__ import annotations

from gpuslice.agent.gpus.fake import FakeBackend
from gpuslice.controller.status import Findings, build_status
from gpuslice.planning.left_out import ANNOTATION, DEVICE_PLUGIN, LeftOut, decode, left_out_annotations
from gpuslice.planning.node.device_plugins import advertised, describe, left_out
from gpuslice.planning.reads.usage import Usage
from gpuslice.planning.selection import Selection
from tests.builders import policy_model as policy

GPUS = FakeBackend("n", [("h100-80gb", 2)]).discover()
H100 = "NVIDIA H100 80GB HBM3"


def node(allocatable: dict[str, str], labels: dict[str, str] | None = None) -> dict[str, object]:
    return {"metadata": {"name": "n", "labels": labels or {}},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", **allocatable}}}


def test_nvidia_resources_in_the_allocatable_are_a_device_plugin_whatever_the_labels() -> None:
    assert advertised(node({})) == {}
    assert advertised(node({"nvidia.com/gpu": "0"})) == {}, "none advertised: no plugin's GPUs"
    assert advertised(node({"example.com/foo": "3", "hugepages-2Mi": "0"})) == {}
    # NVIDIA's with MIG mixed strategy, without the GPU Operator's labels (a standalone plugin).
    found = advertised(node({"nvidia.com/gpu": "1", "nvidia.com/mig-1g.10gb": "7"}))
    assert found == {"nvidia.com/gpu": "1", "nvidia.com/mig-1g.10gb": "7"}
    assert describe(found) == "nvidia.com/gpu: 1, nvidia.com/mig-1g.10gb: 7"
    assert advertised(node({"nvidia.com/gpumem": "81559"})) == {"nvidia.com/gpumem": "81559"}, "HAMi's"
    assert advertised({"metadata": {"name": "n"}}) == {}, "a Node without a status yet"


def test_each_policy_selecting_a_gpu_there_is_told_and_the_controller_says_why() -> None:
    memory = policy("mem", {"mode": "memory", "sliceSize": "10Gi"})
    other = policy("other", {"mode": "shared", "sliceSize": "10Gi"}, nodeSelector={"matchLabels": {"pool": "b"}})
    found = left_out({"pool": "a"}, GPUS, [memory, other], {"nvidia.com/gpu": "2"})
    assert found == (LeftOut("mem", DEVICE_PLUGIN, 0, H100), LeftOut("mem", DEVICE_PLUGIN, 1, H100))
    assert left_out({}, GPUS, [memory], {}) == ()
    annotations = left_out_annotations(found)
    assert decode(annotations) == found, "the controller reads it back (an agent of another version: ignored)"
    assert ANNOTATION in annotations
    status = build_status(memory, Findings([], Selection(()), 0, Usage(), left_out=[("n", i) for i in found]), "now")
    degraded = next(c for c in status.conditions if c.type == "Degraded")
    assert (degraded.status, degraded.reason) == ("True", DEVICE_PLUGIN)
    assert degraded.message.startswith(f"node n GPU 0 ({H100}), node n GPU 1 ({H100}) are on nodes whose allocatable"
                                       " advertises a device plugin's NVIDIA resources")
    assert "nvidia.com/gpu.deploy.device-plugin=false" in degraded.message
