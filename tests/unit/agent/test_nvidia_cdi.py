"""What a container is given for each kind of device on each NVIDIA node setup: the toolkit's spec
listing each device, only ``all`` (the GPU Operator), omitting the MIG-enabled GPU, the device
plugin's, or none (``cdi_fixtures`` builds them by the toolkit's own rules)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest
import yaml

from gpuslice.agent.gpus import GpuBackendError, MigInstance
from gpuslice.agent.gpus.nvml import NvmlBackend
from gpuslice.dra import cdi
from gpuslice.dra.nvidia_cdi import parse_device_major, parse_mig_minors
from gpuslice.inventory.gpus import Gpu
from gpuslice.planning.grants import Grant
from gpuslice.planning.node_pool import plan_node_pool
from tests.unit.agent import cdi_fixtures
from tests.unit.agent.libnvml import FakeLibNvml, installed
from tests.unit.planning.test_node_pool import policy

MIG_UUID = "MIG-static-0000-0000-0000-000000000001"


@pytest.fixture
def lib() -> Iterator[FakeLibNvml]:
    with installed(FakeLibNvml([("a100-40gb", False), ("a100-40gb", True)])) as fake:
        yield fake


class Node:
    def __init__(self, root: Path, specs: dict[str, str]) -> None:
        self.cdi = root / "cdi"
        self.cdi.mkdir()
        for name, text in specs.items():
            (self.cdi / name).write_text(text)
        self.paths = cdi_fixtures.host(root)
        self.backend = NvmlBackend(pynvml, cdi_dirs=(self.cdi, root / "missing"), **self.paths)
        self.gpus = self.backend.discover()

    def minor(self, key: str) -> int:
        return parse_mig_minors((self.paths["proc"] / "driver/nvidia-caps/mig-minors").read_text())[key]

    def grant(self, gpu: Gpu) -> Grant:
        [device] = plan_node_pool({}, [gpu], [policy("p", {"mode": "shared", "sliceSize": "5Gi"})]).typed
        return Grant("ns/c", "gpu", device)


def nodes(edits: cdi.ContainerEdits) -> list[dict[str, Any]]:
    return list(edits.manifest().get("deviceNodes") or [])


def spec_edits(text: str, device: str | None = None) -> dict[str, Any]:
    """A spec's edits (of one device, or common), device nodes in path order as gpuslice writes them."""
    spec = yaml.safe_load(text)
    edits = dict(spec["containerEdits"] if device is None else
                 next(d for d in spec["devices"] if d["name"] == device)["containerEdits"])
    if "deviceNodes" in edits:
        edits["deviceNodes"] = sorted(edits["deviceNodes"], key=lambda n: n["path"])
    return edits


def test_spec_listing_each_device(lib: FakeLibNvml, tmp_path: Path) -> None:
    text = cdi_fixtures.nvml_mode(lib.gpus[0].uuid, MIG_UUID)
    node = Node(tmp_path, {"nvidia.yaml": text})
    gpu0, gpu1 = node.gpus
    whole = node.backend.access(node.grant(gpu0), gpu0, None)
    assert whole.edits.manifest() == spec_edits(text, gpu0.uuid), "the spec's own entry for this GPU, by UUID"
    assert whole.common is not None
    common = whole.common.manifest()
    toolkit = spec_edits(text)
    assert (common["mounts"], common["hooks"]) == (toolkit["mounts"], toolkit["hooks"]), "the driver, as is"
    assert [n["path"] for n in common["deviceNodes"]] == sorted(
        ["/dev/nvidia-modeset", "/dev/nvidia-uvm-tools", "/dev/nvidia-uvm", "/dev/nvidiactl"]), "each node once"
    assert common["env"] == sorted(toolkit["env"]), "NVIDIA_VISIBLE_DEVICES=void as the toolkit sets it"
    assert "CUDA_VISIBLE_DEVICES" not in str(whole), "visibility is the device nodes, as with NVIDIA's tools"

    static = MigInstance(gpu1.uuid, "1g.5gb", 0, 1, gi=7, ci=0, uuid=MIG_UUID)
    assert node.backend.access(node.grant(gpu1), gpu1, static).edits.manifest() == spec_edits(text, MIG_UUID)

    # A dynamic instance is newer than any spec, and its GPU is in MIG mode (no whole-GPU entry).
    dynamic = MigInstance(gpu1.uuid, "1g.5gb", 3, 1, gi=2, ci=0, uuid="MIG-new")
    made = nodes(node.backend.access(node.grant(gpu1), gpu1, dynamic).edits)
    gi, ci = node.minor("gpu1/gi2/access"), node.minor("gpu1/gi2/ci0/access")
    major = parse_device_major((node.paths["proc"] / "devices").read_text())
    assert made == [{"path": "/dev/nvidia-caps/nvidia-cap" + str(m), "type": "c", "major": major, "minor": m,
                     "fileMode": 0o444} for m in sorted((gi, ci), key=str)] + [{"path": "/dev/nvidia1"}]


def test_spec_that_leaves_out_a_mig_enabled_gpu(lib: FakeLibNvml, tmp_path: Path) -> None:
    """A whole-GPU device (say a memory slice) of GPU 1, which the spec omits: made by the rules."""
    node = Node(tmp_path, {"nvidia.yaml": cdi_fixtures.nvml_mode(lib.gpus[0].uuid, MIG_UUID)})
    gpu1 = node.gpus[1]
    assert nodes(node.backend.access(node.grant(gpu1), gpu1, None).edits) == [{"path": "/dev/nvidia1"}]


def test_gpu_operators_spec_with_only_all(lib: FakeLibNvml, tmp_path: Path) -> None:
    text = cdi_fixtures.management_mode()
    node = Node(tmp_path, {"management.nvidia.com-gpu.yaml": text})
    gpu0, gpu1 = node.gpus
    access = node.backend.access(node.grant(gpu0), gpu0, None)
    assert nodes(access.edits) == [{"path": "/dev/dri/card1"}, {"path": "/dev/dri/renderD128"},
                                   {"path": "/dev/nvidia0"}], "GPU 0 only, never the spec's all"
    assert access.common is not None
    common = access.common.manifest()
    assert common["mounts"] == spec_edits(text)["mounts"]
    assert [n["path"] for n in common["deviceNodes"]] == ["/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
                                                          "/dev/nvidiactl"], "the control nodes the host has"
    assert access.cdi_version == "0.8.0", "the claim spec says the version the copied edits need"
    dynamic = MigInstance(gpu1.uuid, "1g.5gb", 0, 1, gi=1, ci=0, uuid="MIG-new")
    assert [n["path"] for n in nodes(node.backend.access(node.grant(gpu1), gpu1, dynamic).edits)][-1] == "/dev/nvidia1"


def test_device_plugins_spec(lib: FakeLibNvml, tmp_path: Path) -> None:
    node = Node(tmp_path, {"k8s.device-plugin.nvidia.com-gpu_abc.json": json.dumps(
        yaml.safe_load(cdi_fixtures.device_plugin(lib.gpus[0].uuid)))})
    gpu0 = node.gpus[0]
    access = node.backend.access(node.grant(gpu0), gpu0, None)
    assert nodes(access.edits) == [{"path": "/dev/nvidia0"}]
    assert access.common is not None
    assert "/dev/nvidia-uvm-tools" in str(access.common.manifest()), "a control node the spec lacked, from the host"


def test_an_index_named_entry_of_another_gpu_is_not_taken(lib: FakeLibNvml, tmp_path: Path) -> None:
    stale = cdi_fixtures.nvml_mode("GPU-gone", MIG_UUID).replace("/dev/nvidia0", "/dev/nvidia3")
    node = Node(tmp_path, {"nvidia.yaml": stale})
    gpu0 = node.gpus[0]
    assert [n["path"] for n in nodes(node.backend.access(node.grant(gpu0), gpu0, None).edits)] == [
        "/dev/dri/card1", "/dev/dri/renderD128", "/dev/nvidia0"], "entry '0' is /dev/nvidia3: made instead"


def test_no_spec_says_what_is_missing_at_start_and_at_prepare(lib: FakeLibNvml, tmp_path: Path) -> None:
    node = Node(tmp_path, {"other.yaml": "cdiVersion: 0.6.0\nkind: vendor.example/nic\ndevices: []\n"})
    [problem] = node.backend.container_problems()
    assert "holds the driver's libraries and hooks" in problem
    assert "nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml" in problem
    gpu0 = node.gpus[0]
    with pytest.raises(GpuBackendError, match=r"no libcuda.so, libnvidia-ml.so or nvidia-smi"):
        node.backend.access(node.grant(gpu0), gpu0, None)


def test_without_mig_minors_a_mig_prepare_says_why(lib: FakeLibNvml, tmp_path: Path) -> None:
    node = Node(tmp_path, {"nvidia.yaml": cdi_fixtures.nvml_mode(lib.gpus[0].uuid, MIG_UUID)})
    (node.paths["proc"] / "driver/nvidia-caps/mig-minors").unlink()
    gpu1 = node.gpus[1]
    dynamic = MigInstance(gpu1.uuid, "1g.5gb", 0, 1, gi=1, ci=0, uuid="MIG-new")
    with pytest.raises(GpuBackendError, match=r"mig-minors does not exist"):
        node.backend.access(node.grant(gpu1), gpu1, dynamic)


def test_a_claim_spec_carries_the_common_edits_once_at_the_version_they_need() -> None:
    common = cdi.ContainerEdits.from_spec(yaml.safe_load(cdi_fixtures.management_mode())["containerEdits"])
    one = cdi.ContainerEdits(device_nodes=(cdi.DeviceNode("/dev/nvidia0"),))
    two = cdi.ContainerEdits(device_nodes=(cdi.DeviceNode("/dev/nvidia1"),))
    spec = cdi.claim_spec({"u-a": one, "u-b": two}, common + common + cdi.ContainerEdits(env={"X": "1"}), "0.8.0")
    assert spec["cdiVersion"] == "0.8.0"
    assert spec["containerEdits"]["hooks"] == [dict(h) for h in common.hooks], "hooks kept once, in order"
    assert cdi.claim_spec({}, None)["cdiVersion"] == cdi.CDI_VERSION


def test_visible_devices_is_void_even_when_an_older_spec_does_not_say_it(lib: FakeLibNvml, tmp_path: Path) -> None:
    """NVIDIA_VISIBLE_DEVICES=void keeps the legacy hook from adding every GPU to a container whose
    image says NVIDIA_VISIBLE_DEVICES=all (CUDA images do); toolkits before wrapper.go's did not write it."""
    spec = yaml.safe_load(cdi_fixtures.device_plugin(lib.gpus[0].uuid))
    del spec["containerEdits"]["env"]
    node = Node(tmp_path, {"nvidia.yaml": yaml.safe_dump(spec)})
    access = node.backend.access(node.grant(node.gpus[0]), node.gpus[0], None)
    assert access.common is not None
    assert access.common.env == {"NVIDIA_VISIBLE_DEVICES": "void"}


def test_the_hosts_mps_pipe_directory_is_not_copied(lib: FakeLibNvml, tmp_path: Path) -> None:
    """The toolkit mounts the host's /tmp/nvidia-mps into every container when it existed as the spec
    was generated (internal/discover/ipc.go); gpuslice gives MPS clients their own GPU's daemon only."""
    spec = yaml.safe_load(cdi_fixtures.nvml_mode(lib.gpus[0].uuid, MIG_UUID))
    ipc = {"hostPath": "/tmp/nvidia-mps", "containerPath": "/tmp/nvidia-mps",
           "options": ["nosuid", "nodev", "rbind", "rprivate", "noexec"]}
    spec["containerEdits"]["mounts"].append(ipc)
    node = Node(tmp_path, {"nvidia.yaml": yaml.safe_dump(spec)})
    access = node.backend.access(node.grant(node.gpus[0]), node.gpus[0], None)
    assert access.common is not None
    mounts = access.common.manifest()["mounts"]
    assert ipc not in mounts
    assert {"hostPath": "/run/nvidia-persistenced/socket", "containerPath": "/run/nvidia-persistenced/socket",
            "options": ["ro", "nosuid", "nodev", "rbind", "rprivate"]} in mounts, "the other sockets stay"
