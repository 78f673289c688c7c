"""The NVIDIA Container Toolkit's CDI specs built by hand from its generator's rules, one per node setup, for
a node with GPU 0 (not in MIG mode) and GPU 1 (MIG mode on, one 1g.5gb instance: GPU instance 7,
compute instance 0) as ``libnvml.FakeLibNvml`` describes them.

Built from NVIDIA/nvidia-container-toolkit's ``pkg/nvcdi``: the common edits of ``common-nvml.go``
and ``driver-nvml.go`` (control nodes, driver libraries and binaries as mounts, the
``nvidia-cdi-hook`` hooks, ``NVIDIA_CTK_LIBCUDA_DIR``) and ``wrapper.go``'s
``NVIDIA_VISIBLE_DEVICES=void``; per device ``dgpu/nvml.go`` (``/dev/nvidia<minor>``, DRM nodes and
the by-path symlink hook for a GPU; the parent's node and the two capability nodes for a MIG device);
``lib-nvml.go`` leaves out the whole-GPU entry of a MIG-enabled GPU; the default naming strategies
``index`` and ``uuid`` name each device twice (``cmd/nvidia-ctk/cdi/generate``); ``management.go``
writes the single device ``all`` and no control nodes in the common edits.

The GPU Operator's containerised driver keeps the node's device nodes and libraries under the driver
root, ``/run/nvidia/driver`` (``cmd/nvidia-validator/driver.go`` ``getDriverInfo``), and its toolkit
container names them there: ``hostPath: /run/nvidia/driver/dev/nvidia0``, mounts from
``/run/nvidia/driver/usr/lib64``, hooks from ``/usr/local/nvidia/toolkit`` (``toolkit.go``
``generateCDISpec`` and the root transform of ``pkg/nvcdi/transform/root``); its nodes carry the
major, minor and mode nvcdi read from them, never a ``type`` (``internal/edits/device.go``).
``operator_host`` is such a node: the host's ``/dev`` has no NVIDIA node, the agent's container has
them all (the ``nvidia`` runtime class put them there).

Hand-built so that each test can vary one thing (the driver, the toolkit's version, DRM nodes, a hook's
path); what NVIDIA's own generator (v1.20.2) writes for a node is in ``tests/unit/dra/nvidia_ctk/``, and
these follow it (1.20.x's apply-cuda-memory-limits, update-application-profile and void mount included).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

LIBS = "/usr/lib/x86_64-linux-gnu"
HOOK = "/usr/bin/nvidia-cdi-hook"
Spec = dict[str, Any]


def _mount(path: str) -> Spec:
    return {"hostPath": path, "containerPath": path, "options": ["ro", "nosuid", "nodev", "rbind", "rprivate"]}


def _hook(*args: str) -> Spec:
    return {"hookName": "createContainer", "path": HOOK, "args": ["nvidia-cdi-hook", *args]}


def _nodes(*paths: str) -> list[Spec]:
    return [{"path": p} for p in paths]


def driver_edits(device_node_hook: bool = True, driver: str = "580.95.05", compat_hook: bool = True) -> Spec:
    """``driver-nvml.go``: the libraries, binaries, firmware and IPC socket of ``driver`` as mounts,
    and the hooks, in the order the generator writes them (``compat_hook``: a management spec has the
    enable-cuda-compat hook since toolkit 1.20)."""
    hooks = [_hook("create-symlinks", "--link", f"libcuda.so.1::{LIBS}/libcuda.so")]
    if compat_hook:
        hooks.append(_hook("enable-cuda-compat", f"--host-driver-version={driver}"))
    hooks.append(_hook("update-ldcache", "--folder", LIBS))
    if device_node_hook:  # management mode turns this one off (options.go), and has no graphics hook
        hooks += [_hook("disable-device-node-modification"), _hook("update-application-profile")]
    # 1.20.2's "void volume-mount device", in every mode (tests/unit/dra/nvidia_ctk/*.yaml).
    void = {"hostPath": "/dev/null", "containerPath": "/var/run/nvidia-container-devices/void",
            "options": ["ro", "nosuid", "nodev", "bind"]}
    return {"mounts": [*(_mount(p) for p in (
        f"{LIBS}/libcuda.so.{driver}", f"{LIBS}/libnvidia-ml.so.{driver}",
        f"{LIBS}/libnvidia-ptxjitcompiler.so.{driver}", "/usr/bin/nvidia-smi",
        f"/lib/firmware/nvidia/{driver}/gsp_ga10x.bin", "/run/nvidia-persistenced/socket")), void], "hooks": hooks}


def nvml_mode(gpu0: str, mig_uuid: str, driver: str = "580.95.05") -> str:
    """``nvidia-ctk cdi generate`` (or the nvidia-cdi-refresh service): kind nvidia.com/gpu."""
    # A DRM node of group video (44), not open to all: nvcdi writes its gid and the group as
    # additionalGids (internal/edits/device.go).
    card = {"path": "/dev/dri/card1", "major": 226, "minor": 1, "fileMode": 0o660, "permissions": "rwm", "gid": 44}
    # Each whole GPU's entry has the per-GPU apply-cuda-memory-limits hook since 1.20.1
    # (tests/unit/dra/nvidia_ctk/nvml.yaml).
    limits = {"hookName": "createRuntime", "path": HOOK, "env": ["NVIDIA_CTK_DEBUG=false"],
              "args": ["nvidia-cdi-hook", "apply-cuda-memory-limits", "--driver-root", "/", "--gpu-id", gpu0]}
    gpu0_edits = {"deviceNodes": [*_nodes("/dev/nvidia0"), card, *_nodes("/dev/dri/renderD128")],
                  "hooks": [_hook("create-symlinks", "--link", "../card1::/dev/dri/by-path/pci-0000:18:00.0-card"),
                            limits],
                  "additionalGids": [44]}
    # gpu1/gi7/access and gpu1/gi7/ci0/access in host()'s mig-minors (nvcdi keys them on the parent's minor).
    mig_edits = {"deviceNodes": _nodes("/dev/nvidia1", "/dev/nvidia-caps/nvidia-cap201",
                                       "/dev/nvidia-caps/nvidia-cap202")}
    devices = [{"name": "0", "containerEdits": gpu0_edits}, {"name": gpu0, "containerEdits": gpu0_edits},
               # GPU 1 is in MIG mode: no '1' and no GPU-... entry for it, only its MIG device.
               {"name": "1:0", "containerEdits": mig_edits}, {"name": mig_uuid, "containerEdits": mig_edits},
               {"name": "all", "containerEdits": {"deviceNodes": _nodes(
                   "/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia-caps/nvidia-cap201", "/dev/nvidia-caps/nvidia-cap202")}}]
    common = {"env": ["NVIDIA_VISIBLE_DEVICES=void", f"NVIDIA_CTK_LIBCUDA_DIR={LIBS}"],
              "deviceNodes": _nodes("/dev/nvidia-modeset", "/dev/nvidia-uvm-tools", "/dev/nvidia-uvm", "/dev/nvidiactl"),
              **driver_edits(driver=driver)}
    return yaml.safe_dump({"cdiVersion": "0.7.0", "kind": "nvidia.com/gpu", "devices": devices,
                           "containerEdits": common}, sort_keys=False)


MAJORS = {"nvidia": 195, "nvidia-caps": 234, "nvidia-uvm": 508}
OPERATOR_DRIVER_ROOT = "/run/nvidia/driver"
OPERATOR_HOOK = "/usr/local/nvidia/toolkit/nvidia-cdi-hook"


def _numbers(path: str) -> tuple[int, int]:
    name = path.removeprefix("/dev/")
    fixed = {"nvidiactl": (195, 255), "nvidia-modeset": (195, 254), "nvidia-uvm": (508, 0), "nvidia-uvm-tools": (508, 1)}
    if name in fixed:
        return fixed[name]
    if name.startswith("nvidia-caps/nvidia-cap"):
        return MAJORS["nvidia-caps"], int(name.removeprefix("nvidia-caps/nvidia-cap"))
    return MAJORS["nvidia"], int(name.removeprefix("nvidia"))


def management_mode(driver_root: str = "", driver: str = "580.95.05", toolkit: str = "1.20") -> str:
    """The GPU Operator's toolkit container (cdi.enabled): kind management.nvidia.com/gpu, device all.
    With ``driver_root`` (the Operator's containerised driver), every host path is under it, and each
    node carries what nvcdi read from it (``fromPathOrDefault``: major, minor, mode; no type). As
    ``toolkit`` writes it: 1.20 adds the enable-cuda-compat hook to management specs, 1.18 first
    writes ``NVIDIA_CTK_LIBCUDA_DIR`` (``driver-nvml.go``)."""
    paths = ("/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
             "/dev/nvidia-modeset", "/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2")
    every = _nodes(*paths)
    if driver_root:
        for node in every:
            major, minor = _numbers(node["path"])
            node.update({"hostPath": f"{driver_root}{node['path']}", "major": major, "minor": minor,
                         "fileMode": 0o666 if "caps" not in node["path"] else 0o444,
                         "permissions": "rwm"})
    env = ["NVIDIA_VISIBLE_DEVICES=void", *([f"NVIDIA_CTK_LIBCUDA_DIR={LIBS}"] if toolkit >= "1.18" else [])]
    common = {"env": env, **driver_edits(device_node_hook=False, driver=driver, compat_hook=toolkit >= "1.20")}
    if driver_root:
        for mount in common["mounts"]:
            mount["hostPath"] = driver_root + mount["hostPath"]
        for hook in common["hooks"]:
            hook["path"] = OPERATOR_HOOK
            hook["env"] = ["NVIDIA_CTK_DEBUG=false"]
    return yaml.safe_dump({"cdiVersion": "0.5.0" if driver_root else "0.8.0", "kind": "management.nvidia.com/gpu",
                           "devices": [{"name": "all", "containerEdits": {"deviceNodes": every}}],
                           "containerEdits": common}, sort_keys=False)


def device_plugin(gpu0: str) -> str:
    """The device plugin with CDI on: kind k8s.device-plugin.nvidia.com/gpu, devices by UUID."""
    return yaml.safe_dump({"cdiVersion": "0.5.0", "kind": "k8s.device-plugin.nvidia.com/gpu",
                           "devices": [{"name": gpu0, "containerEdits": {"deviceNodes": _nodes("/dev/nvidia0")}}],
                           "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"],
                                              "deviceNodes": _nodes("/dev/nvidiactl", "/dev/nvidia-uvm"),
                                              **driver_edits()}}, sort_keys=False)


def host(root: Path, gpus: int = 2) -> dict[str, Path]:
    """A node's /dev, /proc and /sys for the fixtures: GPU 0 at 0000:18:00.0 with its DRM nodes, the
    control nodes but nvidia-modeset, every MIG capability of GPU 1 (the driver lists them all)."""
    dev, proc, sys = root / "dev", root / "proc", root / "sys"
    (dev / "dri").mkdir(parents=True)
    for node in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", *(f"nvidia{i}" for i in range(gpus)),
                 "dri/card1", "dri/renderD128"):
        (dev / node).touch()
    (proc / "driver/nvidia-caps").mkdir(parents=True)
    lines = ["config 1", "monitor 2"]
    minor = 3
    for gpu in range(gpus):
        for gi in range(15):
            lines.append(f"gpu{gpu}/gi{gi}/access {minor}")
            minor += 1
            for ci in range(8):
                lines.append(f"gpu{gpu}/gi{gi}/ci{ci}/access {minor}")
                minor += 1
    (proc / "driver/nvidia-caps/mig-minors").write_text("\n".join(lines) + "\n")
    (proc / "devices").write_text("Character devices:\n  1 mem\n195 nvidia\n226 drm\n234 nvidia-caps\n"
                                  "508 nvidia-uvm\n\nBlock devices:\n  8 sd\n")
    for name, number in (("card1", "226:1"), ("renderD128", "226:128")):
        (sys / "bus/pci/devices/0000:18:00.0/drm" / name).mkdir(parents=True)
        (sys / "bus/pci/devices/0000:18:00.0/drm" / name / "dev").write_text(number + "\n")
    return {"dev": dev, "proc": proc, "sysfs": sys}


def operator_host(root: Path) -> Path:
    """The host's own file tree on a GPU Operator node with the containerised driver: no NVIDIA node
    in /dev, all of them under /run/nvidia/driver/dev (where the toolkit's spec names them)."""
    host_root = root / "host"
    (host_root / "dev").mkdir(parents=True)
    (host_root / "dev/null").touch()
    driver_dev = host_root / OPERATOR_DRIVER_ROOT.lstrip("/") / "dev"
    (driver_dev / "nvidia-caps").mkdir(parents=True)
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset",
                 "nvidia-caps/nvidia-cap1", "nvidia-caps/nvidia-cap2"):
        (driver_dev / name).touch()
    return host_root
