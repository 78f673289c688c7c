"""What gpuslice gives a container for each kind of device, against what NVIDIA's own generator gives
that device: the specs ``nvidia-ctk`` v1.20.2 wrote over the mock NVML library (``nvidia_ctk/``, written
by ``python -m gpuslice.devcluster.nvidia_specs`` and compared with what it writes now in
``tests/unit/devcluster/test_nvidia_specs.py``), one per toolkit setup.

Every difference is asserted, so that a change on either side shows here, and each one's reason is in
docs/nvidia.md ("What nvidia-ctk gives each device, and what gpuslice gives"):

- ``apply-cuda-memory-limits``: nvml mode puts it on each whole GPU's entry; gpuslice copies that entry
  for a whole GPU, a memory slice and a shared device alike, and sets neither of the variables it reads
  (``NVIDIA_GPU_MEMORY_REQUEST``/``LIMIT``), so it changes nothing; a management spec has no per-GPU
  entry, so nothing carries it there. MIG devices have none in either.
- MIG devices' capability nodes: gpuslice makes them typed (``c`` and the kernel's numbers), never
  from the spec entry, which names the host's nodes.
- The common edits: copied, with the control nodes and ``disable-device-node-modification`` a management
  spec leaves out added.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuslice.agent.gpus.nvidia_cdi import load_toolkit
from gpuslice.devcluster.mocknvml import MAJORS, mig_minors
from gpuslice.dra.cdi import ContainerEdits, DeviceNode
from gpuslice.dra.nvidia_cdi import GpuRef, HostFacts, MigRef, common_edits, mig_edits, whole_gpu_edits

SPECS = Path(__file__).parent / "nvidia_ctk"
DRIVER = "550.54.15"
NODE = json.loads((SPECS / "node.json").read_text())
# NVML's bus ids of the DGX H100 mock's first GPUs, normalised.
BUSES = ("0000:1b:00.0", "0000:43:00.0")
HOST = HostFacts(majors=MAJORS, mig_minors=dict(mig_minors(2)))


def spec(setup: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((SPECS / f"{setup}.yaml").read_text())
    return loaded


def gpu0_uuid() -> str:
    return next(d["name"] for d in spec("nvml")["devices"] if d["name"].startswith("GPU-"))


def mig(gi: int) -> tuple[str, str]:
    """(profile, UUID) of GPU 1's instance ``gi``."""
    instance = next(i for i in NODE["state"]["gpus"]["1"]["instances"] if i["id"] == gi)
    profile = {19: "1g.10gb", 9: "3g.40gb"}[instance["profileId"]]
    return profile, instance["computeInstances"][0]["uuid"]


def toolkit_of(setup: str, tmp_path: Path) -> Any:
    directory = tmp_path / setup
    directory.mkdir()
    shutil.copy(SPECS / f"{setup}.yaml", directory / "nvidia.yaml")
    return load_toolkit([directory], DRIVER)


def numbers(nodes: Any) -> set[tuple[str, str, int, int]]:
    """(path, host path, major, minor) of each node: what a runtime makes in the container."""
    found = set()
    for node in nodes:
        if isinstance(node, DeviceNode):
            found.add((node.path, node.host_path or node.path, node.major or 0, node.minor or 0))
        else:
            found.add((node["path"], node.get("hostPath") or node["path"], node.get("major", 0), node.get("minor", 0)))
    return found


def entry(setup: str, name: str) -> dict[str, Any]:
    return next(d["containerEdits"] for d in spec(setup)["devices"] if d["name"] == name)


def hook_names(hooks: Any) -> list[str]:
    return [h["args"][1] for h in hooks]


@pytest.mark.parametrize("kind", ["whole", "memory slice", "shared"])
def test_a_whole_gpu_gets_nvidia_ctks_entry_of_it(kind: str, tmp_path: Path) -> None:
    """A whole-GPU device, a memory slice and a shared device all get their GPU: nvidia-ctk's entry
    of that GPU, its apply-cuda-memory-limits hook included (inert: gpuslice sets neither of its variables)."""
    toolkit = toolkit_of("nvml", tmp_path)
    ours = whole_gpu_edits(toolkit, GpuRef(gpu0_uuid(), 0, 0, BUSES[0]), HOST)
    theirs = entry("nvml", gpu0_uuid())
    assert numbers(ours.edits.device_nodes) == numbers(theirs["deviceNodes"]) == {
        ("/dev/nvidia0", "/dev/nvidia0", 195, 0)}
    assert list(ours.edits.hooks) == theirs["hooks"]
    assert hook_names(ours.edits.hooks) == ["apply-cuda-memory-limits"]
    assert theirs["hooks"][0]["args"][-2:] == ["--gpu-id", gpu0_uuid()]
    assert not {"NVIDIA_GPU_MEMORY_REQUEST", "NVIDIA_GPU_MEMORY_LIMIT"} & set(ours.edits.env)


@pytest.mark.parametrize(("kind", "gi"), [("static", 7), ("dynamic", 2)])
def test_a_mig_device_gets_nvidia_ctks_nodes_typed(kind: str, gi: int, tmp_path: Path) -> None:
    """Static or dynamic, a MIG device gets its parent's node and its GPU and compute instance's
    capability nodes: the numbers nvidia-ctk gives its entry, typed so that the runtime makes them."""
    toolkit = toolkit_of("nvml", tmp_path)
    profile, uuid = mig(gi)
    ours = mig_edits(toolkit, GpuRef("GPU-1", 1, 1, BUSES[1]), MigRef(profile, gi, 0), HOST).edits
    theirs = entry("nvml", uuid)
    assert {(p, major, minor) for p, _, major, minor in numbers(ours.device_nodes)} == {
        (p, major, minor) for p, _, major, minor in numbers(theirs["deviceNodes"])}
    assert {n.type for n in ours.device_nodes if "caps" in n.path} == {"c"}
    assert "hooks" not in theirs
    assert not ours.hooks, "no hook for a MIG device, in either"


@pytest.mark.parametrize("setup", ["management", "operator"])
def test_on_a_management_spec_a_gpu_gets_all_s_node_and_no_memory_limit_hook(setup: str, tmp_path: Path) -> None:
    """The GPU Operator's spec has the single device all: a whole GPU's node is all's of that path
    (under the containerised driver's root on the operator's), a MIG device's capability nodes typed;
    no per-GPU entry, so no apply-cuda-memory-limits hook."""
    toolkit = toolkit_of(setup, tmp_path)
    every = numbers(entry(setup, "all")["deviceNodes"])
    whole = whole_gpu_edits(toolkit, GpuRef(gpu0_uuid(), 0, 0, BUSES[0]), HOST).edits
    assert numbers(whole.device_nodes) <= every
    root = "/run/nvidia/driver" if setup == "operator" else ""
    assert numbers(whole.device_nodes) == {("/dev/nvidia0", f"{root}/dev/nvidia0", 195, 0)}
    assert not whole.hooks
    profile, _ = mig(7)
    ours = mig_edits(toolkit, GpuRef("GPU-1", 1, 1, BUSES[1]), MigRef(profile, 7, 0), HOST).edits
    assert {(p, major, minor) for p, _, major, minor in numbers(ours.device_nodes)} <= {
        (p, major, minor) for p, _, major, minor in every}


@pytest.mark.parametrize("setup", ["nvml", "management", "operator"])
def test_the_common_edits_are_nvidia_ctks_and_what_a_management_spec_lacks(setup: str, tmp_path: Path) -> None:
    toolkit = toolkit_of(setup, tmp_path)
    ours: ContainerEdits = common_edits(toolkit, HOST)
    theirs = spec(setup)["containerEdits"]
    assert list(ours.mounts) == theirs["mounts"], "libraries, and 1.20.2's void mount, as written"
    assert {"containerPath": "/var/run/nvidia-container-devices/void", "hostPath": "/dev/null",
            "options": ["ro", "nosuid", "nodev", "bind"]} in theirs["mounts"]
    env = dict(item.split("=", 1) for item in theirs["env"])
    assert {k: ours.env[k] for k in env} == env
    names = hook_names(theirs["hooks"])
    if setup == "nvml":
        assert hook_names(ours.hooks) == names
        assert "update-application-profile" in names
        assert numbers(ours.device_nodes) == numbers(theirs["deviceNodes"])
    else:  # management mode leaves out the device-node hook and the control nodes (its all has them)
        assert hook_names(ours.hooks) == [*names, "disable-device-node-modification"]
        assert {n.path for n in ours.device_nodes} == {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
                                                        "/dev/nvidia-modeset"}
        assert numbers(ours.device_nodes) <= numbers(entry(setup, "all")["deviceNodes"])
