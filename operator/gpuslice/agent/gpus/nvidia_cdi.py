"""Reading what ``dra.nvidia_cdi`` needs from the node: the NVIDIA Container Toolkit's CDI specs
and the device facts of /dev, /proc and /sys.

gpuslice reads the toolkit's specs and never runs ``nvidia-ctk cdi generate`` itself. NVIDIA's DRA
driver generates in process (``cmd/gpu-kubelet-plugin/cdi.go``, nvcdi as a Go library, its common
edits cached for five minutes because they do not change with the device): what it generates per
device is what ``dra.nvidia_cdi`` makes from NVML's minor number, ``mig-minors`` and sysfs, and what
it generates for all devices is the toolkit spec's common edits. Running the binary at prepare would
add the toolkit and the driver's file tree to the agent's image and seconds to every prepare, for
the same answer; a node without any spec says so at start (``NvmlBackend.container_problems``).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable
from pathlib import Path

import yaml

from gpuslice.dra.cdi import CDI_VERSION, ContainerEdits, DeviceNode, cdi_devices
from gpuslice.dra.nvidia_cdi import (
    CONTROL_NODES,
    HostFacts,
    gpu_node,
    parse_char_devices,
    parse_mig_minors,
)
from gpuslice.dra.nvidia_toolkit import ACCEPTED, Toolkit, ToolkitSpec

DEFAULT_SPEC_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))


def load_toolkit(directories: Iterable[Path], driver: str | None = None) -> Toolkit:
    """The toolkit's specs in ``directories`` (``.json``/``.yaml``; a file that does not parse is
    another driver's problem, which the runtime reports), for NVML's ``driver`` version. A later
    directory has the higher priority, as in CDI (``/var/run/cdi`` over ``/etc/cdi``)."""
    directories = tuple(directories)
    specs = []
    for priority, directory in enumerate(directories):
        if not directory.is_dir():
            continue
        for path in sorted(directory.iterdir()):
            if path.suffix not in (".json", ".yaml", ".yml"):
                continue
            try:
                text = path.read_text()
                spec = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
            except (OSError, ValueError, yaml.YAMLError):
                continue
            if not isinstance(spec, dict) or spec.get("kind") not in ACCEPTED:
                continue
            devices = {str(d.get("name")): ContainerEdits.from_spec(d.get("containerEdits") or {})
                       for d in cdi_devices(spec) if d.get("name")}
            specs.append(ToolkitSpec(str(path), str(spec["kind"]), str(spec.get("cdiVersion") or CDI_VERSION),
                                     ContainerEdits.from_spec(spec.get("containerEdits") or {}), devices, priority))
    return Toolkit(specs, " and ".join(str(d) for d in directories) or "(no directory)", driver)


def host_facts(bus_ids: Iterable[str], minors: Iterable[int], dev: Path = Path("/dev"),
               proc: Path = Path("/proc"), sys: Path = Path("/sys")) -> HostFacts:
    """What the kernel says about the GPUs with these PCI bus ids and minor numbers: /proc and /sys
    are the kernel's own; ``dev`` (the agent's /dev) only gives the numbers and mode of a node it has."""
    try:
        majors = parse_char_devices((proc / "devices").read_text())
    except OSError:
        majors = {}
    try:
        mig_minors: dict[str, int] | None = parse_mig_minors((proc / "driver/nvidia-caps/mig-minors").read_text())
    except OSError:
        mig_minors = None
    drm: dict[str, tuple[DeviceNode, ...]] = {}
    for bus_id in bus_ids:
        try:
            entries = sorted((sys / "bus/pci/devices" / bus_id / "drm").iterdir())
        except OSError:
            entries = []
        drm[bus_id] = tuple(node for entry in entries if (node := _sysfs_node(entry)) is not None)
    wanted = [*CONTROL_NODES, *(gpu_node(m) for m in minors), *(n.path for nodes in drm.values() for n in nodes)]
    seen = {path: node for path in wanted if (node := char_device(dev, path)) is not None}
    return HostFacts(majors, mig_minors, drm, seen)


def _sysfs_node(entry: Path) -> DeviceNode | None:
    """``/sys/bus/pci/devices/<bus id>/drm/card1`` (its ``dev`` file says ``226:1``) -> /dev/dri/card1."""
    try:
        major, _, minor = (entry / "dev").read_text().strip().partition(":")
        return DeviceNode(f"/dev/dri/{entry.name}", type="c", major=int(major), minor=int(minor))
    except (OSError, ValueError):
        return None


def char_device(dev: Path, path: str) -> DeviceNode | None:
    """The character device at ``path`` in ``dev`` (the agent's /dev), typed as a stat sees it."""
    try:
        found = os.stat(dev / path.removeprefix("/dev/"))
    except OSError:
        return None
    if not stat.S_ISCHR(found.st_mode):
        return None
    # Its group too where not root's, as nvcdi reads it (a DRM node's video or render group).
    return DeviceNode(path, type="c", major=os.major(found.st_rdev), minor=os.minor(found.st_rdev),
                      file_mode=stat.S_IMODE(found.st_mode), gid=found.st_gid or None)
