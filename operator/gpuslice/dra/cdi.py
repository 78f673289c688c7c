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

from gpuslice.jsontypes import objects_in

CDI_VERSION = "0.6.0"
VENDOR = "gpuslice.dev"
CLASS = "gpu"
KIND = f"{VENDOR}/{CLASS}"
SPEC_PREFIX = f"{VENDOR}-{CLASS}_"  # the CDI convention: <vendor>-<class>_<what>.json
_DEVICE_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")


@dataclass(frozen=True)
class DeviceNode:
    """A device node the container gets (``/dev/nvidia0``). With ``type``, ``major`` and ``minor``
    the runtime makes the node in the container without looking at the host (how NVIDIA's DRA
    driver grants MIG capability nodes a host may not have: its ``cdi.go``)."""

    path: str
    host_path: str | None = None
    type: str | None = None
    major: int | None = None
    minor: int | None = None
    file_mode: int | None = None
    permissions: str | None = None
    uid: int | None = None
    gid: int | None = None

    def manifest(self) -> dict[str, Any]:
        node: dict[str, Any] = {"path": self.path}
        if self.host_path and self.host_path != self.path:
            node["hostPath"] = self.host_path
        for key, value in (("type", self.type), ("major", self.major), ("minor", self.minor),
                           ("fileMode", self.file_mode), ("permissions", self.permissions), ("uid", self.uid),
                           ("gid", self.gid)):
            if value is not None:
                node[key] = value
        return node

    @classmethod
    def from_spec(cls, node: Mapping[str, Any]) -> DeviceNode:
        """A ``deviceNodes`` entry of someone else's spec, as written there (nvcdi writes a DRM
        node's ``gid``: ``internal/edits/device.go``)."""
        def number(key: str) -> int | None:
            value = node.get(key)
            return int(value) if isinstance(value, int) else None

        return cls(str(node.get("path", "")), node.get("hostPath"), node.get("type"), number("major"),
                   number("minor"), number("fileMode"), node.get("permissions"), number("uid"), number("gid"))


@dataclass(frozen=True)
class ContainerEdits:
    """What a CDI device (or a spec, for any of its devices) adds to a container. Environment
    and device nodes are sorted (one node per path), so that the same grant always yields the same
    file; hooks and mounts keep the order they were given in (the NVIDIA toolkit's hooks run in
    order: symlinks before the ld cache update), as the spec they were copied from wrote them."""

    env: Mapping[str, str] = field(default_factory=dict)
    device_nodes: Sequence[DeviceNode] = ()
    hooks: Sequence[Mapping[str, Any]] = ()
    mounts: Sequence[Mapping[str, Any]] = ()
    additional_gids: Sequence[int] = ()

    def manifest(self) -> dict[str, Any]:
        edits: dict[str, Any] = {}
        if self.env:
            edits["env"] = [f"{k}={v}" for k, v in sorted(self.env.items())]
        if self.device_nodes:
            by_path = {n.path: n for n in self.device_nodes}
            edits["deviceNodes"] = [by_path[p].manifest() for p in sorted(by_path)]
        if self.hooks:
            edits["hooks"] = [dict(h) for h in self.hooks]
        if self.mounts:
            edits["mounts"] = [dict(m) for m in self.mounts]
        if self.additional_gids:
            edits["additionalGids"] = list(self.additional_gids)
        return edits

    def __add__(self, other: ContainerEdits) -> ContainerEdits:
        """Both sets of edits (``other``'s variables win; hooks and mounts seen twice are kept once)."""
        return ContainerEdits(
            env={**self.env, **other.env}, device_nodes=(*self.device_nodes, *other.device_nodes),
            hooks=_unique((*self.hooks, *other.hooks)), mounts=_unique((*self.mounts, *other.mounts)),
            additional_gids=tuple(dict.fromkeys((*self.additional_gids, *other.additional_gids))))

    @classmethod
    def from_spec(cls, edits: Mapping[str, Any]) -> ContainerEdits:
        """A ``containerEdits`` of someone else's spec (only what CDI defines; intelRdt and
        netDevices, which no NVIDIA spec writes, are not carried)."""
        env = dict(str(e).split("=", 1) for e in edits.get("env") or [] if "=" in str(e))
        return cls(env=env, device_nodes=tuple(DeviceNode.from_spec(n) for n in edits.get("deviceNodes") or []),
                   hooks=tuple(edits.get("hooks") or ()), mounts=tuple(edits.get("mounts") or ()),
                   additional_gids=tuple(int(g) for g in edits.get("additionalGids") or ()))


def _unique(items: Sequence[Mapping[str, Any]]) -> tuple[Mapping[str, Any], ...]:
    seen: list[Mapping[str, Any]] = []
    for item in items:
        if item not in seen:
            seen.append(item)
    return tuple(seen)


def newer_version(*versions: str) -> str:
    """The newest CDI version (``0.6.0`` < ``0.8.0`` < ``1.0.0``)."""
    def key(version: str) -> tuple[int, ...]:
        return tuple(int(p) if p.isdigit() else 0 for p in version.split("."))

    return max(versions, key=key)


def cdi_devices(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The devices of a CDI spec (``devices``: a name and its edits each), in order; a spec read from
    a node's files may be anything, and a field that is not a list of objects reads as none."""
    return objects_in(spec.get("devices"))


def required_version(spec: Mapping[str, Any]) -> str:
    """The oldest CDI version whose schema has every field ``spec`` uses, by the rules of CDI's
    ``MinimumRequiredVersion`` (``specs-go/version.go``): a runtime refuses a spec that says less
    (``ValidateVersion``), and edits copied from another spec may need more than that spec's own
    version says of the spec gpuslice writes (``additionalGids`` needs 0.7.0)."""
    devices = cdi_devices(spec)
    edits = [spec.get("containerEdits") or {}, *((d.get("containerEdits") or {}) for d in devices)]
    if any(e.get("netDevices") or (e.get("intelRdt") or {}).get("schemata") is not None
           or (e.get("intelRdt") or {}).get("enableMonitoring") for e in edits):
        return "1.1.0"
    if any(e.get("additionalGids") or e.get("intelRdt") is not None for e in edits):
        return "0.7.0"
    if spec.get("annotations") or any(d.get("annotations") for d in devices) \
            or "." in str(spec.get("kind", "")).partition("/")[2]:
        return "0.6.0"
    if any(str(d.get("name", ""))[:1].isdigit() for d in devices) \
            or any(n.get("hostPath") for e in edits for n in e.get("deviceNodes") or ()):
        return "0.5.0"
    if any(m.get("type") for e in edits for m in e.get("mounts") or ()):
        return "0.4.0"
    return "0.3.0"


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
    is injected. Its ``cdiVersion`` is ``CDI_VERSION``, or what its content requires when more."""
    spec: dict[str, Any] = {
        "cdiVersion": CDI_VERSION,
        "kind": KIND,
        "devices": [{"name": name, "containerEdits": edits.manifest()} for name, edits in sorted(devices.items())],
    }
    if common is not None and (edits := common.manifest()):
        spec["containerEdits"] = edits
    spec["cdiVersion"] = newer_version(CDI_VERSION, required_version(spec))
    return spec
