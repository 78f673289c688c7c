"""CDI specs for prepared claims (Container Device Interface), as pure data.

One spec file per claim, of kind ``gpuslice.dev/gpu``, holding one CDI device per
allocated device. CDI device names must be unique per kind across every spec on
the node, so each is prefixed with the claim's UID; a device shared by several
claims (consumable capacity) then appears once per claim. The container runtime
(or, on fake nodes, the pod runner) resolves the ids the plugin returns against
these files. Writing them is the agent's business (``agent.kubeletplugin.cdi``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

CDI_VERSION = "0.6.0"
VENDOR = "gpuslice.dev"
CLASS = "gpu"
KIND = f"{VENDOR}/{CLASS}"
SPEC_PREFIX = f"{VENDOR}-{CLASS}_"  # the CDI convention: <vendor>-<class>_<what>.json
_DEVICE_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")


@dataclass(frozen=True)
class DeviceNode:
    """A device node the container gets (``/dev/nvidia-caps/nvidia-cap12``)."""

    path: str
    host_path: str | None = None

    def manifest(self) -> dict[str, Any]:
        node: dict[str, Any] = {"path": self.path}
        if self.host_path and self.host_path != self.path:
            node["hostPath"] = self.host_path
        return node


@dataclass(frozen=True)
class ContainerEdits:
    """What a CDI device adds to a container: environment and device nodes (sorted, so that the
    same grant always yields the same file)."""

    env: Mapping[str, str] = field(default_factory=dict)
    device_nodes: Sequence[DeviceNode] = ()

    def manifest(self) -> dict[str, Any]:
        edits: dict[str, Any] = {}
        if self.env:
            edits["env"] = [f"{k}={v}" for k, v in sorted(self.env.items())]
        if self.device_nodes:
            edits["deviceNodes"] = [n.manifest() for n in sorted(self.device_nodes, key=lambda n: n.path)]
        return edits


def device_name(claim_uid: str, device: str) -> str:
    """The CDI name of ``device`` as prepared for one claim: ``<claim uid>-<device>``."""
    name = f"{claim_uid}-{device}"
    if not _DEVICE_NAME.match(name):
        raise ValueError(f"{name!r} is not a valid CDI device name (letters, digits, '_', '.', ':', '-')")
    return name


def qualified(name: str) -> str:
    """The id a container runtime resolves: ``gpuslice.dev/gpu=<name>``."""
    return f"{KIND}={name}"


def spec_file_name(claim_uid: str) -> str:
    return f"{SPEC_PREFIX}{claim_uid}.json"


def claim_uid_of(file_name: str) -> str | None:
    """The claim UID a spec file of ours was written for; None for anyone else's file."""
    if not (file_name.startswith(SPEC_PREFIX) and file_name.endswith(".json")):
        return None
    return file_name[len(SPEC_PREFIX):-len(".json")] or None


def claim_spec(devices: Mapping[str, ContainerEdits], common: ContainerEdits | None = None) -> dict[str, Any]:
    """The spec of one claim: ``devices`` by CDI name; ``common`` edits apply whenever any of them
    is injected."""
    spec: dict[str, Any] = {
        "cdiVersion": CDI_VERSION,
        "kind": KIND,
        "devices": [{"name": name, "containerEdits": edits.manifest()} for name, edits in sorted(devices.items())],
    }
    if common is not None and (edits := common.manifest()):
        spec["containerEdits"] = edits
    return spec
