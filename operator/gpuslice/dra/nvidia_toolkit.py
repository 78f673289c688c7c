"""The NVIDIA Container Toolkit's CDI specs on a node, and which of them a claim's spec copies
(pure: ``agent.gpus.nvidia_cdi`` reads the files).

A node may hold several: ``nvidia-ctk cdi generate`` or its ``nvidia-cdi-refresh`` service writes
``nvidia.com/gpu``, the GPU Operator's toolkit ``management.nvidia.com/gpu``, the device plugin
``k8s.device-plugin.nvidia.com/gpu`` (``ACCEPTED``, best first), in ``/etc/cdi`` or ``/var/run/cdi``.
A spec holds the paths of one driver's libraries (``libcuda.so.580.95.05``) and says that driver's
version to its ``enable-cuda-compat`` hook (``--host-driver-version=580.95.05``,
``internal/discover/compat_libs.go``): one left from before a driver upgrade would mount files
that are gone, and the container would not start. So the specs are ranked: first those of the
driver NVML reports (or that say no version), then by kind, then by directory, the later directory
first, as CDI gives it the higher priority (``pkg/cdi/spec-dirs.go``, ``cache.go``: a device of
``/var/run/cdi`` replaces one of ``/etc/cdi``). A spec of another driver is never copied from.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from gpuslice.dra.cdi import ContainerEdits, DeviceNode
from gpuslice.errors import GpusliceError

ACCEPTED = ("nvidia.com/gpu", "management.nvidia.com/gpu", "k8s.device-plugin.nvidia.com/gpu")
GENERATE = ("`nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml` on the node (NVIDIA Container Toolkit"
            " 1.18+ runs it at boot as the nvidia-cdi-refresh service), or with the GPU Operator keep"
            " cdi.enabled=true (its toolkit writes /var/run/cdi/management.nvidia.com-gpu.yaml)")
_HOST_DRIVER = re.compile(r"^--host-driver-version=(\S+)$")
_LIBRARY = re.compile(r"^lib(?:cuda|nvidia-ml)\.so\.(\d+(?:\.\d+)+)$")


class NvidiaCdiError(GpusliceError):
    """A container cannot be given the device; the message says what is missing and the fix."""


@dataclass(frozen=True)
class ToolkitSpec:
    """One of the toolkit's spec files; ``priority``: its directory's place in the search order
    (CDI's: a later directory wins)."""

    path: str
    kind: str
    version: str
    common: ContainerEdits
    devices: Mapping[str, ContainerEdits]
    priority: int = 0

    @property
    def driver_version(self) -> str | None:
        """The driver the spec was made for: its enable-cuda-compat hook's, else its libraries'
        suffix (management specs before toolkit 1.20 have no such hook); None when it says neither."""
        for hook in self.common.hooks:
            for arg in hook.get("args") or ():
                if match := _HOST_DRIVER.match(str(arg)):
                    return match[1]
        for mount in self.common.mounts:
            name = str(mount.get("hostPath") or mount.get("containerPath") or "").rsplit("/", 1)[-1]
            if match := _LIBRARY.match(name):
                return match[1]
        return None


@dataclass(frozen=True)
class Edits:
    """A device's edits, and where they come from (for the check and the logs)."""

    edits: ContainerEdits
    source: str


class Toolkit:
    """The toolkit's specs found on the node, best first; ``driver``: NVML's driver version (None:
    not known, every spec is taken as this driver's)."""

    def __init__(self, specs: Sequence[ToolkitSpec], searched: str, driver: str | None = None) -> None:
        self.driver = driver
        self.specs = tuple(sorted(specs, key=lambda s: (self._fit(s), ACCEPTED.index(s.kind), -s.priority, s.path)))
        self.searched = searched

    def _fit(self, spec: ToolkitSpec) -> int:
        """0: the spec is this driver's; 1: it does not say; 2: another driver's."""
        if spec.driver_version is None or self.driver is None:
            return 1
        return 0 if spec.driver_version == self.driver else 2

    def stale(self) -> list[ToolkitSpec]:
        """Specs made for another driver (never copied from)."""
        return [s for s in self.specs if self._fit(s) == 2]

    def usable(self) -> Iterator[ToolkitSpec]:
        return (s for s in self.specs if self._fit(s) < 2)

    def common(self) -> ToolkitSpec:
        """The spec whose common edits every claim copies; NvidiaCdiError when none has any."""
        for spec in self.usable():
            if spec.common.mounts or spec.common.hooks:
                return spec
        if stale := [s for s in self.stale() if s.common.mounts or s.common.hooks]:
            found = ", ".join(f"{s.path} ({s.kind}, driver {s.driver_version})" for s in stale)
            raise NvidiaCdiError(
                f"the NVIDIA Container Toolkit's CDI specs in {self.searched} are for another driver ({found}), the"
                f" node's is {self.driver}: a container would get libraries that are not there. Generate the spec"
                f" again: {GENERATE} (the GPU Operator's toolkit pod does when it restarts).")
        found = ", ".join(f"{s.path} ({s.kind}, no common edits)" for s in self.specs) or "none"
        raise NvidiaCdiError(
            f"no NVIDIA Container Toolkit CDI spec in {self.searched} holds the driver's libraries and hooks"
            f" (specs of kind {', '.join(ACCEPTED)} found: {found}), so a container would get the GPU's device"
            f" nodes but no libcuda.so, libnvidia-ml.so or nvidia-smi. Generate one: {GENERATE}.")

    def device(self, names: Sequence[str], proof: str) -> Edits | None:
        """A device entry named one of ``names`` whose nodes include ``proof`` (its ``/dev/nvidia<minor>``:
        an index-named entry of an older spec may be another GPU now)."""
        for spec in self.usable():
            for name in names:
                edits = spec.devices.get(name)
                if edits is not None and any(n.path == proof for n in edits.device_nodes):
                    return Edits(edits, f"{spec.path}: {spec.kind}={name}")
        return None

    def node(self, path: str) -> tuple[DeviceNode, str] | None:
        """The first entry for ``path`` in a spec (any device's, ``all`` included, or the common
        edits), as the toolkit wrote it: its ``hostPath`` is where the host has the node."""
        for spec in self.usable():
            for name, edits in (("", spec.common), *spec.devices.items()):
                for node in edits.device_nodes:
                    if node.path == path:
                        return node, f"{spec.path}: {f'{spec.kind}={name}' if name else 'common edits'}"
        return None

    def dev_roots(self) -> set[str]:
        """Where the specs say the host keeps its device nodes (``/run/nvidia/driver`` for
        ``hostPath: /run/nvidia/driver/dev/nvidia0``; ``/`` when a node is at its own path)."""
        roots = set()
        for spec in self.usable():
            for edits in (spec.common, *spec.devices.values()):
                for node in edits.device_nodes:
                    host = node.host_path or node.path
                    if host.endswith(node.path):
                        roots.add(host[:-len(node.path)] or "/")
        return roots
