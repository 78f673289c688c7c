"""The NVIDIA Container Toolkit's CDI specs as its generator writes them, one per node setup, for
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


def driver_edits(device_node_hook: bool = True) -> Spec:
    """``driver-nvml.go``: the libraries, binaries, firmware and IPC socket of driver 580.95.05 as
    mounts, and the hooks, in the order the generator writes them."""
    hooks = [_hook("create-symlinks", "--link", f"libcuda.so.1::{LIBS}/libcuda.so"),
             _hook("enable-cuda-compat", "--host-driver-version=580.95.05"), _hook("update-ldcache", "--folder", LIBS)]
    if device_node_hook:  # management mode turns this one off (options.go)
        hooks.append(_hook("disable-device-node-modification"))
    return {"mounts": [_mount(p) for p in (
        f"{LIBS}/libcuda.so.580.95.05", f"{LIBS}/libnvidia-ml.so.580.95.05",
        f"{LIBS}/libnvidia-ptxjitcompiler.so.580.95.05", "/usr/bin/nvidia-smi",
        "/lib/firmware/nvidia/580.95.05/gsp_ga10x.bin", "/run/nvidia-persistenced/socket")], "hooks": hooks}


def nvml_mode(gpu0: str, mig_uuid: str) -> str:
    """``nvidia-ctk cdi generate`` (or the nvidia-cdi-refresh service): kind nvidia.com/gpu."""
    gpu0_edits = {"deviceNodes": _nodes("/dev/nvidia0", "/dev/dri/card1", "/dev/dri/renderD128"),
                  "hooks": [_hook("create-symlinks", "--link", "../card1::/dev/dri/by-path/pci-0000:18:00.0-card")]}
    mig_edits = {"deviceNodes": _nodes("/dev/nvidia1", "/dev/nvidia-caps/nvidia-cap66", "/dev/nvidia-caps/nvidia-cap67")}
    devices = [{"name": "0", "containerEdits": gpu0_edits}, {"name": gpu0, "containerEdits": gpu0_edits},
               # GPU 1 is in MIG mode: no '1' and no GPU-... entry for it, only its MIG device.
               {"name": "1:0", "containerEdits": mig_edits}, {"name": mig_uuid, "containerEdits": mig_edits},
               {"name": "all", "containerEdits": {"deviceNodes": _nodes(
                   "/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia-caps/nvidia-cap66", "/dev/nvidia-caps/nvidia-cap67")}}]
    common = {"env": ["NVIDIA_VISIBLE_DEVICES=void", f"NVIDIA_CTK_LIBCUDA_DIR={LIBS}"],
              "deviceNodes": _nodes("/dev/nvidia-modeset", "/dev/nvidia-uvm-tools", "/dev/nvidia-uvm", "/dev/nvidiactl"),
              **driver_edits()}
    return yaml.safe_dump({"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": devices,
                           "containerEdits": common}, sort_keys=False)


def management_mode() -> str:
    """The GPU Operator's toolkit container (cdi.enabled): kind management.nvidia.com/gpu, device all."""
    every = _nodes("/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
                   "/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2")
    return yaml.safe_dump({"cdiVersion": "0.8.0", "kind": "management.nvidia.com/gpu",
                           "devices": [{"name": "all", "containerEdits": {"deviceNodes": every}}],
                           "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"],
                                              **driver_edits(device_node_hook=False)}}, sort_keys=False)


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
    (proc / "devices").write_text("Character devices:\n  1 mem\n195 nvidia\n234 nvidia-caps\n508 nvidia-uvm\n\n"
                                  "Block devices:\n  8 sd\n")
    (sys / "bus/pci/devices/0000:18:00.0/drm/card1").mkdir(parents=True)
    (sys / "bus/pci/devices/0000:18:00.0/drm/renderD128").mkdir(parents=True)
    return {"dev": dev, "proc": proc, "sysfs": sys}
