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
from collections.abc import Iterable
from pathlib import Path

import yaml

from gpuslice.dra.cdi import CDI_VERSION, ContainerEdits
from gpuslice.dra.nvidia_cdi import (
    ACCEPTED,
    CONTROL_NODES,
    HostFacts,
    Toolkit,
    ToolkitSpec,
    parse_device_major,
    parse_mig_minors,
)

DEFAULT_SPEC_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))


def load_toolkit(directories: Iterable[Path]) -> Toolkit:
    """The toolkit's specs in ``directories`` (``.json``/``.yaml``; a file that does not parse is
    another driver's problem, which the runtime reports)."""
    directories = tuple(directories)
    specs = []
    for directory in directories:
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
                       for d in spec.get("devices") or [] if isinstance(d, dict) and d.get("name")}
            specs.append(ToolkitSpec(str(path), str(spec["kind"]), str(spec.get("cdiVersion") or CDI_VERSION),
                                     ContainerEdits.from_spec(spec.get("containerEdits") or {}), devices))
    return Toolkit(specs, " and ".join(str(d) for d in directories) or "(no directory)")


def host_facts(bus_ids: Iterable[str], minors: Iterable[int], dev: Path = Path("/dev"),
               proc: Path = Path("/proc"), sys: Path = Path("/sys")) -> HostFacts:
    """What the node's files say about the GPUs with these PCI bus ids and minor numbers."""
    wanted = [*CONTROL_NODES, *(f"/dev/nvidia{m}" for m in minors)]
    existing = frozenset(p for p in wanted if (dev / p.removeprefix("/dev/")).exists())
    try:
        mig_minors: dict[str, int] | None = parse_mig_minors(
            (proc / "driver/nvidia-caps/mig-minors").read_text())
    except OSError:
        mig_minors = None
    try:
        major = parse_device_major((proc / "devices").read_text())
    except OSError:
        major = None
    drm: dict[str, tuple[str, ...]] = {}
    for bus_id in bus_ids:
        try:
            names = sorted(p.name for p in (sys / "bus/pci/devices" / bus_id / "drm").iterdir())
        except OSError:
            names = []
        drm[bus_id] = tuple(f"/dev/dri/{n}" for n in names if (dev / "dri" / n).exists())
    return HostFacts(existing, mig_minors, major, drm)
