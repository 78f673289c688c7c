"""What a container is given for each kind of device on each NVIDIA node setup: the toolkit's spec
listing each device, only ``all`` (the GPU Operator), omitting the MIG-enabled GPU, the device
plugin's, or none (``cdi_fixtures`` builds them by the toolkit's own rules)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pynvml
import pytest
import yaml

from gpuslice.agent.gpus import GpuBackendError, MigInstance, nvidia_cdi
from gpuslice.agent.gpus.nvml import NvmlBackend
from gpuslice.dra import cdi
from gpuslice.dra.nvidia_cdi import parse_char_devices, parse_mig_minors
from gpuslice.inventory.gpus import Gpu
from gpuslice.planning.grants import Grant
from gpuslice.planning.node.node_pool import plan_node_pool
from tests.builders import policy_model as policy
from tests.unit.agent import cdi_fixtures
from tests.unit.agent.libnvml import FakeLibNvml, installed

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
        return grant(gpu)


def grant(gpu: Gpu) -> Grant:
    """A grant of the GPU (its edits depend on the GPU and the instance given with it); planned as if
    MIG mode were off, as a shared policy publishes only then (planning.node.mig_mode)."""
    [device] = plan_node_pool({}, [replace(gpu, mig_enabled=False)],
                              [policy("p", {"mode": "shared", "sliceSize": "5Gi"})]).typed
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
    assert node.backend.access(node.grant(gpu1), gpu1, static).edits.manifest() == {"deviceNodes": mig_nodes(node, 7, 0)}, \
        "the rules, not the entry"

    # A dynamic instance is newer than any spec, and its GPU is in MIG mode (no whole-GPU entry).
    dynamic = MigInstance(gpu1.uuid, "1g.5gb", 3, 1, gi=2, ci=0, uuid="MIG-new")
    made = nodes(node.backend.access(node.grant(gpu1), gpu1, dynamic).edits)
    assert made == mig_nodes(node, 2, 0)


def mig_nodes(node: Node, gi: int, ci: int) -> list[dict[str, Any]]:
    """A GPU 1 instance's nodes, in the order gpuslice writes them (by path): its typed capability
    nodes (mig-minors' gpu1/gi<G>/access, gpu1/gi<G>/ci<C>/access) and the parent's node."""
    major = parse_char_devices((node.paths["proc"] / "devices").read_text())["nvidia-caps"]
    minors = sorted((node.minor(f"gpu1/gi{gi}/access"), node.minor(f"gpu1/gi{gi}/ci{ci}/access")), key=str)
    return [*({"path": f"/dev/nvidia-caps/nvidia-cap{m}", "type": "c", "major": major, "minor": m, "fileMode": 0o444}
              for m in minors), {"path": "/dev/nvidia1"}]


def test_a_static_mig_instance_gets_its_capability_nodes_when_the_spec_entry_lacks_them(
        lib: FakeLibNvml, tmp_path: Path) -> None:
    """nvcdi leaves out a node it cannot find, so an instance made from a container may be listed
    with its parent's node only (dra-driver-nvidia-gpu#787): the capability nodes come from mig-minors."""
    spec = yaml.safe_load(cdi_fixtures.nvml_mode(lib.gpus[0].uuid, MIG_UUID))
    for device in spec["devices"]:
        if device["name"] in ("1:0", MIG_UUID):
            device["containerEdits"]["deviceNodes"] = [{"path": "/dev/nvidia1"}]
    node = Node(tmp_path, {"nvidia.yaml": yaml.safe_dump(spec)})
    gpu1 = node.gpus[1]
    static = MigInstance(gpu1.uuid, "1g.5gb", 0, 1, gi=7, ci=0, uuid=MIG_UUID)
    made = nodes(node.backend.access(node.grant(gpu1), gpu1, static).edits)
    assert made == mig_nodes(node, 7, 0)


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
    assert nodes(access.edits) == [{"path": "/dev/dri/card1", "type": "c", "major": 226, "minor": 1},
                                   {"path": "/dev/dri/renderD128", "type": "c", "major": 226, "minor": 128},
                                   {"path": "/dev/nvidia0"}], "GPU 0 only, never the spec's all"
    assert access.common is not None
    common = access.common.manifest()
    assert common["mounts"] == spec_edits(text)["mounts"]
    assert [n["path"] for n in common["deviceNodes"]] == ["/dev/nvidia-modeset", "/dev/nvidia-uvm",
                                                          "/dev/nvidia-uvm-tools", "/dev/nvidiactl"], "from all"
    dynamic = MigInstance(gpu1.uuid, "1g.5gb", 0, 1, gi=1, ci=0, uuid="MIG-new")
    assert [n["path"] for n in nodes(node.backend.access(node.grant(gpu1), gpu1, dynamic).edits)][-1] == "/dev/nvidia1"


def containerd_refuses(node: dict[str, Any], host_root: Path) -> str | None:
    """What containerd's CDI code says of a device node (``fillMissingInfo``, CDI's
    ``pkg/cdi/container-edits_unix.go``): the host's node at ``hostPath`` (``path`` when unset) is
    stat'ed, and a node that is not there is refused unless typed (``type`` and a ``major``)."""
    if (host_root / str(node.get("hostPath") or node["path"]).lstrip("/")).exists():
        return None
    if node.get("type") and node.get("major"):
        return None
    return f"failed to stat CDI host device {node.get('hostPath') or node['path']!r}"


def test_the_gpu_operators_containerised_driver(lib: FakeLibNvml, tmp_path: Path) -> None:
    """Its host has no /dev/nvidia*, the agent's container has them all: every node a claim's spec
    names must still be one containerd accepts (the toolkit's entry with its hostPath, or typed)."""
    text = cdi_fixtures.management_mode(cdi_fixtures.OPERATOR_DRIVER_ROOT)
    node = Node(tmp_path, {"management.nvidia.com-gpu.yaml": text})
    host_root = cdi_fixtures.operator_host(tmp_path)
    gpu0, gpu1 = node.gpus
    dynamic = MigInstance(gpu1.uuid, "1g.5gb", 3, 1, gi=2, ci=0, uuid="MIG-new")
    written = [node.backend.access(node.grant(gpu0), gpu0, None), node.backend.access(node.grant(gpu1), gpu1, None),
               node.backend.access(node.grant(gpu1), gpu1, dynamic)]
    every = [n for access in written for edits in (access.edits, access.common) if edits for n in nodes(edits)]
    assert {n["path"] for n in every} >= {"/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm"}
    assert [(n["path"], refused) for n in every if (refused := containerd_refuses(n, host_root))] == []
    management = {n["path"]: n for n in yaml.safe_load(text)["devices"][0]["containerEdits"]["deviceNodes"]}
    gpu_node = next(n for n in nodes(written[0].edits) if n["path"] == "/dev/nvidia0")
    assert gpu_node == management["/dev/nvidia0"], "the toolkit's entry, hostPath included"
    assert written[0].common is not None
    assert {n["path"]: n for n in nodes(written[0].common)}["/dev/nvidia-uvm"] == management["/dev/nvidia-uvm"]


def test_nodes_only_the_agents_container_has_are_not_taken_for_the_hosts(
        lib: FakeLibNvml, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent's /dev (what the nvidia runtime class gave its container) is no evidence of the host's:
    a node no spec names is written typed with the kernel's numbers, and one the kernel lacks is left out."""
    def in_container(dev: Path, path: str) -> cdi.DeviceNode | None:  # its /dev's nodes are real devices
        if not (dev / path.removeprefix("/dev/")).exists() or "dri" in path:
            return None
        major, minor = cdi_fixtures._numbers(path)
        return cdi.DeviceNode(path, type="c", major=major, minor=minor, file_mode=0o666)

    monkeypatch.setattr(nvidia_cdi, "char_device", in_container)
    node = Node(tmp_path, {"nvidia.yaml": yaml.safe_dump({**yaml.safe_load(cdi_fixtures.device_plugin("GPU-x")),
                                                          "devices": []})})
    (node.paths["proc"] / "devices").write_text("Character devices:\n195 nvidia\n226 drm\n\nBlock devices:\n")
    gpu0 = node.gpus[0]
    access = node.backend.access(node.grant(gpu0), gpu0, None)
    assert nodes(access.edits)[-1] == {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0, "fileMode": 0o666}
    assert access.common is not None
    control = {n["path"]: n for n in nodes(access.common)}
    assert "/dev/nvidia-uvm-tools" not in control, "in the agent's /dev, but no nvidia-uvm in /proc/devices"
    assert control["/dev/nvidia-modeset"] == {"path": "/dev/nvidia-modeset", "type": "c", "major": 195, "minor": 254}
    assert control["/dev/nvidia-uvm"] == {"path": "/dev/nvidia-uvm"}, "the spec's own common edits, as written"


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
    spec = cdi.claim_spec({"u-a": one, "u-b": two}, common + common + cdi.ContainerEdits(env={"X": "1"}))
    assert spec["cdiVersion"] == cdi.CDI_VERSION, "what the content needs, not the 0.8.0 the copied spec said"
    assert spec["containerEdits"]["hooks"] == [dict(h) for h in common.hooks], "hooks kept once, in order"
    assert cdi.claim_spec({}, None)["cdiVersion"] == cdi.CDI_VERSION
    gids = cdi.ContainerEdits(device_nodes=(cdi.DeviceNode("/dev/dri/card1"),), additional_gids=(44,))
    assert cdi.claim_spec({"u-a": gids}, common)["cdiVersion"] == "0.7.0", "additionalGids: CDI's requiresV070"


def test_device_edits_of_a_newer_spec_raise_the_claim_specs_version(lib: FakeLibNvml, tmp_path: Path) -> None:
    """The common edits from the Operator's 0.5.0 spec, GPU 0's from a device plugin's spec with
    additionalGids (0.7.0): the claim's spec must say 0.7.0, or the runtime refuses it (ValidateVersion)."""
    plugin = yaml.safe_load(cdi_fixtures.device_plugin(lib.gpus[0].uuid))
    plugin["cdiVersion"] = "0.7.0"
    plugin["devices"][0]["containerEdits"]["additionalGids"] = [44]
    node = Node(tmp_path, {"management.nvidia.com-gpu.yaml": cdi_fixtures.management_mode(
        cdi_fixtures.OPERATOR_DRIVER_ROOT), "k8s.device-plugin.nvidia.com-gpu.yaml": yaml.safe_dump(plugin)})
    gpu0 = node.gpus[0]
    access = node.backend.access(node.grant(gpu0), gpu0, None)
    assert access.edits.additional_gids == (44,)
    assert cdi.claim_spec({"u-gpu0": access.edits}, access.common)["cdiVersion"] == "0.7.0"


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


def directories(tmp_path: Path, etc: dict[str, str], run: dict[str, str]) -> NvmlBackend:
    """A backend reading /etc/cdi, then /var/run/cdi (the default order), with these specs in each."""
    dirs = (tmp_path / "etc/cdi", tmp_path / "var/run/cdi")
    for directory, specs in zip(dirs, (etc, run), strict=True):
        directory.mkdir(parents=True)
        for name, text in specs.items():
            (directory / name).write_text(text)
    return NvmlBackend(pynvml, cdi_dirs=dirs, **cdi_fixtures.host(tmp_path))


def libraries(backend: NvmlBackend) -> set[str]:
    [gpu, _] = backend.discover()
    access = backend.access(grant(gpu), gpu, None)
    assert access.common is not None
    return {str(m["hostPath"]).rsplit("/", 1)[-1] for m in access.common.mounts if "libcuda" in str(m["hostPath"])}


def test_a_spec_left_from_before_a_driver_upgrade_is_not_copied(lib: FakeLibNvml, tmp_path: Path) -> None:
    """A stale /etc/cdi/nvidia.yaml of driver 570 next to the refreshed /var/run/cdi one of 580 (NVML's):
    the claim gets 580's libraries, whichever directory sorts first."""
    stale = cdi_fixtures.nvml_mode(lib.gpus[0].uuid, MIG_UUID, driver="570.86.15")
    fresh = cdi_fixtures.nvml_mode(lib.gpus[0].uuid, MIG_UUID)
    backend = directories(tmp_path, {"nvidia.yaml": stale}, {"nvidia.yaml": fresh})
    assert libraries(backend) == {"libcuda.so.580.95.05"}
    assert backend.container_problems() == []


def test_of_two_specs_of_the_driver_the_later_directory_wins_as_in_cdi(lib: FakeLibNvml, tmp_path: Path) -> None:
    etc = cdi_fixtures.nvml_mode(lib.gpus[0].uuid, MIG_UUID).replace(cdi_fixtures.LIBS, "/usr/lib64")
    backend = directories(tmp_path, {"nvidia.yaml": etc}, {"nvidia.yaml": cdi_fixtures.nvml_mode(lib.gpus[0].uuid,
                                                                                                 MIG_UUID)})
    [gpu, _] = backend.discover()
    common = backend.access(grant(gpu), gpu, None).common
    assert common is not None
    assert {str(m["hostPath"]) for m in common.mounts} >= {f"{cdi_fixtures.LIBS}/libcuda.so.580.95.05"}, \
        "/var/run/cdi's, as CDI's cache prefers it (pkg/cdi/spec-dirs.go)"


def test_only_specs_of_another_driver_publish_nothing_and_say_so(lib: FakeLibNvml, tmp_path: Path) -> None:
    """The GPU Operator's management spec before toolkit 1.20 says its driver only in its libraries' names."""
    old = cdi_fixtures.management_mode(driver="570.86.15", toolkit="1.18")
    backend = directories(tmp_path, {}, {"management.nvidia.com-gpu.yaml": old})
    [problem] = backend.container_problems()
    assert "are for another driver (" in problem
    assert "(management.nvidia.com/gpu, driver 570.86.15)), the node's is 580.95.05" in problem
    [gpu, _] = backend.discover()
    with pytest.raises(GpuBackendError, match=r"are for another driver .*Generate the spec again"):
        backend.access(grant(gpu), gpu, None)
    unknown = yaml.safe_load(old)
    unknown["containerEdits"]["mounts"] = [m for m in unknown["containerEdits"]["mounts"] if ".so." not in m["hostPath"]]
    (tmp_path / "var/run/cdi/management.nvidia.com-gpu.yaml").write_text(yaml.safe_dump(unknown))
    assert backend.container_problems() == [], "a spec that does not say its driver is taken"


def hooks(common: cdi.ContainerEdits | None) -> list[list[str]]:
    assert common is not None
    return [[str(a) for a in h["args"]] for h in common.hooks]


def test_the_device_node_hook_a_management_spec_leaves_out_is_added(lib: FakeLibNvml, tmp_path: Path) -> None:
    """A management spec has no disable-device-node-modification hook (options.go); a claim's spec
    gets it, built as the spec's other hooks (the Operator's nvidia-cdi-hook, its environment), after
    update-ldcache as nvcdi orders it."""
    node = Node(tmp_path, {"management.nvidia.com-gpu.yaml": cdi_fixtures.management_mode(
        cdi_fixtures.OPERATOR_DRIVER_ROOT)})
    common = node.backend.access(node.grant(node.gpus[0]), node.gpus[0], None).common
    assert hooks(common)[-2:] == [["nvidia-cdi-hook", "update-ldcache", "--folder", cdi_fixtures.LIBS],
                                  ["nvidia-cdi-hook", "disable-device-node-modification"]]
    assert common is not None
    assert common.hooks[-1] == {"hookName": "createContainer", "path": cdi_fixtures.OPERATOR_HOOK,
                                "args": ["nvidia-cdi-hook", "disable-device-node-modification"],
                                "env": ["NVIDIA_CTK_DEBUG=false"]}


def test_the_device_node_hook_is_not_added_for_a_toolkit_that_lacks_it(lib: FakeLibNvml, tmp_path: Path) -> None:
    """Toolkit 1.17's nvidia-cdi-hook has no such hook and fails the container on one it does not
    know; its spec has no NVIDIA_CTK_LIBCUDA_DIR. A spec that has the hook keeps the one it has."""
    node = Node(tmp_path, {"management.nvidia.com-gpu.yaml": cdi_fixtures.management_mode(toolkit="1.17")})
    common = node.backend.access(node.grant(node.gpus[0]), node.gpus[0], None).common
    assert "disable-device-node-modification" not in str(hooks(common))
    (tmp_path / "generated").mkdir()
    generated = Node(tmp_path / "generated", {"nvidia.yaml": cdi_fixtures.nvml_mode(lib.gpus[0].uuid, MIG_UUID)})
    common = generated.backend.access(generated.grant(generated.gpus[0]), generated.gpus[0], None).common
    assert sum("disable-device-node-modification" in h for h in hooks(common)) == 1


def test_drm_nodes_made_by_the_rules_carry_their_group_and_by_path_links(
        lib: FakeLibNvml, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As nvcdi makes a GPU's DRM nodes: each node's group where it is not root's, that group as an
    additional GID where the node is not open to all, and the create-symlinks hook of by-path-hooks.go."""
    groups = {"/dev/dri/card1": (226, 1, 0o660, 44), "/dev/dri/renderD128": (226, 128, 0o666, 109)}

    def in_container(dev: Path, path: str) -> cdi.DeviceNode | None:
        if path not in groups:
            return None
        major, minor, mode, gid = groups[path]
        return cdi.DeviceNode(path, type="c", major=major, minor=minor, file_mode=mode, gid=gid)

    monkeypatch.setattr(nvidia_cdi, "char_device", in_container)
    node = Node(tmp_path, {"management.nvidia.com-gpu.yaml": cdi_fixtures.management_mode(
        cdi_fixtures.OPERATOR_DRIVER_ROOT)})
    gpu0 = node.gpus[0]
    edits = node.backend.access(node.grant(gpu0), gpu0, None).edits.manifest()
    assert edits["deviceNodes"][:2] == [
        {"path": "/dev/dri/card1", "type": "c", "major": 226, "minor": 1, "fileMode": 0o660, "gid": 44},
        {"path": "/dev/dri/renderD128", "type": "c", "major": 226, "minor": 128, "fileMode": 0o666, "gid": 109}]
    assert edits["additionalGids"] == [44], "renderD128 is open to all"
    assert edits["hooks"] == [{
        "hookName": "createContainer", "path": cdi_fixtures.OPERATOR_HOOK, "env": ["NVIDIA_CTK_DEBUG=false"],
        "args": ["nvidia-cdi-hook", "create-symlinks", "--link", "../card1::/dev/dri/by-path/pci-0000:18:00.0-card",
                 "--link", "../renderD128::/dev/dri/by-path/pci-0000:18:00.0-render"]}]
