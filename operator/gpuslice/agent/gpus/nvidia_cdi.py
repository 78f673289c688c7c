"""What the NVIDIA Container Toolkit already tells the runtime: its CDI spec, and MIG capability nodes.

gpuslice does not list driver libraries or device nodes itself. The node's toolkit
spec (``nvidia-ctk cdi generate``, or the GPU Operator) names every GPU (and the MIG
devices that existed when it was written) by index and, with the ``uuid`` naming
strategy, by UUID; a device of it brings the driver's libraries and the GPU's nodes.
A dynamic MIG instance is newer than that spec: the container gets its parent GPU's
device plus the two capability nodes that grant the GPU instance and the compute
instance (``/proc/driver/nvidia-caps/mig-minors`` says which).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import yaml

from gpuslice.dra.cdi import DeviceNode

DEFAULT_SPEC_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))
MIG_MINORS = Path("/proc/driver/nvidia-caps/mig-minors")
CAPS_DEVICE_DIR = "/dev/nvidia-caps"


class NvidiaCdiError(Exception):
    pass


@dataclass(frozen=True)
class ToolkitSpecs:
    """The toolkit's CDI devices found on the node: qualified id by device name."""

    ids: dict[str, str]

    @classmethod
    def load(cls, directories: Iterable[Path]) -> ToolkitSpecs:
        ids: dict[str, str] = {}
        for directory in directories:
            if not directory.is_dir():
                continue
            for path in sorted(directory.iterdir()):
                if path.suffix not in (".json", ".yaml", ".yml"):
                    continue
                try:
                    spec = (json.loads(path.read_text()) if path.suffix == ".json"
                            else yaml.safe_load(path.read_text()))
                except (OSError, ValueError, yaml.YAMLError):
                    continue  # another driver's problem; the runtime reports it
                kind = str((spec or {}).get("kind", "")) if isinstance(spec, dict) else ""
                if not kind.startswith("nvidia.com/"):
                    continue
                for device in spec.get("devices") or []:
                    name = str(device.get("name", ""))
                    if name:
                        ids.setdefault(name, f"{kind}={name}")
        return cls(ids)

    def gpu(self, uuid: str, index: int, directories: Iterable[Path]) -> str:
        """The id of a whole GPU, by UUID (preferred: indexes move) or by index."""
        for name in (uuid, str(index)):
            if name in self.ids:
                return self.ids[name]
        where = ", ".join(str(d) for d in directories)
        raise NvidiaCdiError(
            f"no NVIDIA Container Toolkit CDI spec in {where} names GPU {index} ({uuid}). Generate one, e.g."
            " `nvidia-ctk cdi generate --device-name-strategy=uuid --output=/var/run/cdi/nvidia.yaml`"
            " (the GPU Operator does this), and enable CDI in the container runtime.")

    def mig(self, uuid: str, gpu_index: int, mig_index: int | None) -> str | None:
        """The id of a MIG device the spec already names (a static layout's, made before the spec was)."""
        for name in (uuid, f"{gpu_index}:{mig_index}" if mig_index is not None else ""):
            if name and name in self.ids:
                return self.ids[name]
        return None


def parse_mig_minors(text: str) -> dict[str, int]:
    """``gpu0/gi1/access 12`` lines -> {"gpu0/gi1/access": 12}."""
    minors = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            minors[parts[0]] = int(parts[1])
    return minors


def mig_capability_nodes(minors: dict[str, int], gpu_minor: int, gi: int, ci: int) -> tuple[DeviceNode, ...]:
    """The two capability device nodes that let a container use GPU instance ``gi``'s compute
    instance ``ci`` on the GPU with minor number ``gpu_minor``."""
    keys = (f"gpu{gpu_minor}/gi{gi}/access", f"gpu{gpu_minor}/gi{gi}/ci{ci}/access")
    missing = [k for k in keys if k not in minors]
    if missing:
        raise NvidiaCdiError(f"{MIG_MINORS} lists no capability for {', '.join(missing)}; the NVIDIA driver does not"
                             " expose this MIG instance (is nvidia-caps loaded?).")
    return tuple(DeviceNode(f"{CAPS_DEVICE_DIR}/nvidia-cap{minors[k]}") for k in keys)
