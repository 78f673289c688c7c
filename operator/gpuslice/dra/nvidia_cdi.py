"""What a container needs to use an NVIDIA GPU or MIG device, by the NVIDIA Container Toolkit's
rules (pure: the specs and the host's facts are read by ``agent.gpus.nvidia_cdi``).

The toolkit's generator (``pkg/nvcdi`` of NVIDIA/nvidia-container-toolkit) splits a spec in two:

- **common edits**, for any device (``common-nvml.go``, ``driver-nvml.go``): the control nodes
  ``/dev/nvidiactl``, ``/dev/nvidia-uvm``, ``/dev/nvidia-uvm-tools``, ``/dev/nvidia-modeset`` (those
  that exist), the driver's libraries, binaries, firmware and IPC sockets as mounts, the
  ``nvidia-cdi-hook`` hooks (create-symlinks, enable-cuda-compat, update-ldcache, ...),
  ``NVIDIA_CTK_LIBCUDA_DIR``, and ``NVIDIA_VISIBLE_DEVICES=void`` (``wrapper.go``: the legacy hook
  must add nothing to a CDI container, whatever an image's ``NVIDIA_VISIBLE_DEVICES=all`` says);
- **per device** (``internal/platform-support/dgpu/nvml.go``): a whole GPU gets ``/dev/nvidia<minor>``
  and its DRM nodes (``/sys/bus/pci/devices/<bus id>/drm``); a MIG device gets its parent's
  ``/dev/nvidia<minor>`` and the capability nodes of its GPU instance and compute instance,
  ``/dev/nvidia-caps/nvidia-cap<N>`` with N from ``/proc/driver/nvidia-caps/mig-minors`` lines
  ``gpu<minor>/gi<G>/access`` and ``gpu<minor>/gi<G>/ci<C>/access`` (``internal/nvcaps``), plus DRM
  nodes only for a ``+gfx`` profile. Neither sets ``CUDA_VISIBLE_DEVICES``: which devices a container
  sees is which nodes it has (NVIDIA's DRA driver sets neither variable in its claim specs).

Which specs a node has depends on how the toolkit was set up (``ACCEPTED``, in order of preference):
``nvidia-ctk cdi generate`` (or its ``nvidia-cdi-refresh`` service) writes ``nvidia.com/gpu`` with
every device and the common edits, but leaves out a MIG-enabled GPU's whole-GPU entry
(``lib-nvml.go``: ``if isMigEnabled { return nil }``) and knows only the MIG devices that existed when
it ran; the GPU Operator's toolkit container writes ``management.nvidia.com/gpu`` with the single
device ``all`` (every node of every GPU: never given to a tenant) and the common edits
(``management.go``, ``cmd/nvidia-ctk-installer/toolkit/toolkit.go``); the device plugin writes
``k8s.device-plugin.nvidia.com/gpu``. So gpuslice writes each claim's edits itself, as NVIDIA's DRA
driver does (``cmd/gpu-kubelet-plugin/cdi.go``: one transient spec per claim with the common edits
and each device's): the common edits copied from the best spec there is, a whole GPU's own edits
from a spec entry that names exactly that GPU (by UUID, or by index when its nodes prove it is that
GPU), and otherwise made by the rules above. A MIG device's are always made by the rules, never
taken from its spec entry: nvcdi leaves out a node it cannot find (``internal/discover/mounts.go``,
"Could not locate"), so the entry of an instance made from a container may lack its capability
nodes, and NVIDIA's DRA driver builds them itself for that reason (``cdi.go``, "may yield an
incomplete spec for MIG devices", dra-driver-nvidia-gpu#787). The driver's libraries cannot be
made: without a spec holding common edits a prepare fails and says so.

**Every device node gpuslice writes works where the host keeps its nodes elsewhere.** The runtime
stats a node's ``hostPath`` (its ``path`` when unset) on the host, and refuses the container when
that fails unless the node is typed (``type`` and ``major``: CDI's ``fillMissingInfo``,
``pkg/cdi/container-edits_unix.go``). With the GPU Operator's containerised driver the host has no
``/dev/nvidia*``: they are under the driver root (the validator's ``getDriverInfo`` makes
``/run/nvidia/driver`` the dev root, ``cmd/nvidia-validator/driver.go``), and the toolkit's specs
name them ``hostPath: /run/nvidia/driver/dev/...`` (``toolkit.go`` ``generateCDISpec``,
``pkg/nvcdi/transform/root``). So a node is copied from a toolkit spec entry of the same path,
``hostPath`` included (the management spec's ``all`` lists every ``/dev/nvidia*``); otherwise it is
written typed, ``c`` with the numbers the kernel gives it: the majors of ``/proc/devices``
(``nvidia``, ``nvidia-uvm``, ``nvidia-caps``), the minors of ``internal/info/proc/devices``
(``nvidiactl`` 255, ``nvidia-modeset`` 254, ``nvidia-uvm`` 0, ``nvidia-uvm-tools`` 1, a GPU its
NVML minor) and a DRM node's ``dev`` file in sysfs. Which nodes exist is never judged by the
agent's own ``/dev`` (it only lends a node's mode): the ``nvidia`` runtime class puts nodes there
that the host's ``/dev`` may not have.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpuslice.dra.cdi import ContainerEdits, DeviceNode
from gpuslice.dra.nvidia_toolkit import Edits, NvidiaCdiError, Toolkit

CAPS_DEVICE_DIR = "/dev/nvidia-caps"
MIG_MINORS = "/proc/driver/nvidia-caps/mig-minors"
# internal/info/proc/devices/devices.go: the /proc/devices name and the minor of each control node.
# The GPUs' major is "nvidia" since driver 550.40, "nvidia-frontend" before.
CONTROL_NUMBERS = {"/dev/nvidiactl": ("nvidia", 255), "/dev/nvidia-modeset": ("nvidia", 254),
                   "/dev/nvidia-uvm": ("nvidia-uvm", 0), "/dev/nvidia-uvm-tools": ("nvidia-uvm", 1)}
CONTROL_NODES = tuple(CONTROL_NUMBERS)
GPU_MAJOR_NAMES = ("nvidia", "nvidia-frontend")
_GPU_NODE = re.compile(r"/dev/nvidia(\d+)")
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
MPS_PIPE_DIRECTORY = "/tmp/nvidia-mps"  # CUDA's default MPS pipe directory; the toolkit's IPC mount
LIBCUDA_DIR = "NVIDIA_CTK_LIBCUDA_DIR"
NODE_MODIFICATION = "disable-device-node-modification"


@dataclass(frozen=True)
class HostFacts:
    """What the kernel says about the node's devices (read by the agent).

    ``majors``: the character devices of ``/proc/devices`` by name; ``mig_minors``: the parsed
    ``mig-minors`` (None when the file is missing: no MIG here); ``drm``: each GPU's DRM nodes by
    PCI bus id, typed from sysfs; ``seen``: the character devices the agent's own ``/dev`` has,
    typed by a stat, for their mode (that the agent has one says nothing of the host's ``/dev``,
    nor that the kernel still has that device)."""

    majors: Mapping[str, int] = field(default_factory=dict)
    mig_minors: Mapping[str, int] | None = None
    drm: Mapping[str, tuple[DeviceNode, ...]] = field(default_factory=dict)
    seen: Mapping[str, DeviceNode] = field(default_factory=dict)

    def major(self, name: str) -> int | None:
        names = GPU_MAJOR_NAMES if name in GPU_MAJOR_NAMES else (name,)
        return next((self.majors[n] for n in names if n in self.majors), None)

    @property
    def caps_major(self) -> int | None:
        return self.major("nvidia-caps")


@dataclass(frozen=True)
class GpuRef:
    uuid: str
    index: int
    minor: int
    pci_bus_id: str


@dataclass(frozen=True)
class MigRef:
    profile: str
    gi: int
    ci: int


def parse_mig_minors(text: str) -> dict[str, int]:
    """``gpu0/gi1/access 12`` lines -> {"gpu0/gi1/access": 12} (nvcaps' ``processMinorsFile``)."""
    minors = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            minors[parts[0]] = int(parts[1])
    return minors


def parse_char_devices(proc_devices: str) -> dict[str, int]:
    """The character devices of ``/proc/devices`` (before its block devices): {name: major}."""
    majors: dict[str, int] = {}
    for line in proc_devices.split("Block devices:", 1)[0].splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit():
            majors.setdefault(parts[1], int(parts[0]))
    return majors


def common_edits(toolkit: Toolkit, host: HostFacts) -> ContainerEdits:
    """The claim spec's common edits: the toolkit's, plus the control nodes it has not (a management
    spec keeps them in its ``all`` device; nvcdi makes all four where their majors exist,
    ``pkg/system/nvdevices``), the device-node hook where it lacks it (``node_modification_hook``),
    and ``NVIDIA_VISIBLE_DEVICES=void`` where it does not set it; less the host's MPS pipe directory.

    The toolkit mounts ``/tmp/nvidia-mps`` into every container when it existed as the spec was
    generated (``internal/discover/ipc.go``, ``NewIPCDiscoverer``): copied into a claim, it would make
    the container a client of whatever MPS daemon the host runs there. gpuslice decides MPS per
    policy: its MPS clients get their own GPU's daemon (``planning.node.mps``), other containers none."""
    spec = toolkit.common()
    have = {n.path for n in spec.common.device_nodes}
    control = tuple(found.node for p in CONTROL_NODES if p not in have and (found := device_node(toolkit, host, p)))
    env = {} if VISIBLE_DEVICES in spec.common.env else {VISIBLE_DEVICES: "void"}
    hook = node_modification_hook(spec.common)
    added = ContainerEdits(env=env, device_nodes=control, hooks=(hook,) if hook else ())
    common = replace(spec.common, mounts=tuple(m for m in spec.common.mounts
                                               if m.get("containerPath") != MPS_PIPE_DIRECTORY))
    return common + added


def node_modification_hook(common: ContainerEdits) -> Mapping[str, Any] | None:
    """nvcdi's ``disable-device-node-modification`` hook (``driver-nvml.go``: after update-ldcache),
    which keeps libnvidia-ml and nvidia-smi from making the nodes of every GPU in the container,
    where the spec lacks it: a management spec leaves it out (``pkg/nvcdi/options.go``), as a claim's
    spec must not. Only where the spec proves a toolkit of 1.18 or later, the first whose hook binary
    has this hook (1.17's would fail the container on a hook it does not know):
    ``NVIDIA_CTK_LIBCUDA_DIR``, which 1.18 first writes."""
    if LIBCUDA_DIR not in common.env or any(NODE_MODIFICATION in _hook_args(h)[:3] for h in common.hooks):
        return None
    return cdi_hook(common, NODE_MODIFICATION)


def cdi_hook(common: ContainerEdits, name: str, *args: str) -> dict[str, Any] | None:
    """An ``nvidia-cdi-hook`` hook built as the spec's own are (``internal/discover/hooks.go``
    ``Create``: their binary's path, the fixed arguments of ``getFixedArgsForCDIHookCLI``, their
    environment); None when the spec has none to go by."""
    for template in common.hooks:
        binary = str(template.get("path") or "").rsplit("/", 1)[-1]
        if binary in ("nvidia-cdi-hook", "nvidia-ctk") and template.get("hookName") == "createContainer":
            fixed = ["nvidia-ctk", "hook"] if binary == "nvidia-ctk" else [binary]
            hook: dict[str, Any] = {"hookName": "createContainer", "path": template["path"],
                                    "args": [*fixed, name, *args]}
            if template.get("env"):
                hook["env"] = list(template["env"])
            return hook
    return None


def _hook_args(hook: Mapping[str, Any]) -> list[str]:
    return [str(a) for a in hook.get("args") or ()]


def additional_gids(nodes: Sequence[DeviceNode]) -> tuple[int, ...]:
    """The groups a container needs to open these nodes: a node's own where it is not root's and
    not open to all (``internal/edits/device.go``, ``getAdditionalGIDs``)."""
    return tuple(dict.fromkeys(n.gid for n in nodes if n.gid and n.file_mode is not None
                               and not (n.file_mode & 0o4 and n.file_mode & 0o2)))


def drm_edits(toolkit: Toolkit, host: HostFacts, pci_bus_id: str) -> ContainerEdits:
    """A GPU's DRM nodes, the groups they need and the hook that links them in ``/dev/dri/by-path``
    (``internal/platform-support/dgpu/by-path-hooks.go``: ``pci-<bus id>-card`` and ``-render``,
    udev's names, to ``../card<N>``, ``../renderD<N>``)."""
    nodes = drm_nodes(toolkit, host, pci_bus_id)
    links = [f"../{name}::/dev/dri/by-path/pci-{pci_bus_id}-{'card' if name.startswith('card') else 'render'}"
             for n in nodes if (name := n.path.rsplit("/", 1)[-1]).startswith(("card", "renderD"))]
    try:
        hook = cdi_hook(toolkit.common().common, "create-symlinks", *(a for link in links for a in ("--link", link)))
    except NvidiaCdiError:
        hook = None  # no common edits: the claim's prepare fails on them and says why
    return ContainerEdits(device_nodes=nodes, hooks=(hook,) if hook and links else (),
                          additional_gids=additional_gids(nodes))


@dataclass(frozen=True)
class Node:
    node: DeviceNode
    source: str


def kernel_node(host: HostFacts, path: str) -> DeviceNode | None:
    """``path`` typed with the kernel's numbers (None when the kernel has no such device): the
    runtime makes it in the container without looking for it on the host."""
    numbers: tuple[int | None, int] | None = None
    if path in CONTROL_NUMBERS:
        name, minor = CONTROL_NUMBERS[path]
        numbers = (host.major(name), minor)
    elif match := _GPU_NODE.fullmatch(path):
        numbers = (host.major("nvidia"), int(match[1]))
    else:
        drm = next((n for nodes in host.drm.values() for n in nodes if n.path == path), None)
        if drm is not None:
            numbers = (drm.major, drm.minor or 0)
    if numbers is None or numbers[0] is None:
        return None  # whatever the agent's /dev has: the kernel has no such device
    seen = host.seen.get(path)
    if seen is not None and (seen.major, seen.minor) == numbers:
        return seen  # with the mode the driver gave it
    return DeviceNode(path, type="c", major=numbers[0], minor=numbers[1])


def device_node(toolkit: Toolkit, host: HostFacts, path: str) -> Node | None:
    """The node at ``path`` as a container gets it: the toolkit's entry (``hostPath`` included),
    else typed by the kernel's numbers; None when neither knows it."""
    found = toolkit.node(path)
    if found is not None:
        return Node(found[0], found[1])
    typed = kernel_node(host, path)
    return Node(typed, "typed from the kernel's numbers") if typed is not None else None


def gpu_device_node(toolkit: Toolkit, host: HostFacts, minor: int) -> DeviceNode:
    found = device_node(toolkit, host, gpu_node(minor))
    if found is None:
        raise NvidiaCdiError(f"/proc/devices lists no nvidia character device and no toolkit spec names"
                             f" {gpu_node(minor)}: the NVIDIA driver is not loaded on this node.")
    return found.node


def drm_nodes(toolkit: Toolkit, host: HostFacts, pci_bus_id: str) -> tuple[DeviceNode, ...]:
    """The GPU's DRM nodes (sysfs ``/sys/bus/pci/devices/<bus id>/drm``, as ``internal/info/drm``)."""
    return tuple(found.node for n in host.drm.get(pci_bus_id, ()) if (found := device_node(toolkit, host, n.path)))


def gpu_node(minor: int) -> str:
    return f"/dev/nvidia{minor}"


def whole_gpu_edits(toolkit: Toolkit, gpu: GpuRef, host: HostFacts) -> Edits:
    """A whole GPU (a whole-GPU device, a memory slice or a shared device: the container gets the GPU)."""
    node = gpu_node(gpu.minor)
    found = toolkit.device((gpu.uuid, str(gpu.index)), node)
    if found is not None:
        return found
    parent = ContainerEdits(device_nodes=(gpu_device_node(toolkit, host, gpu.minor),))
    return Edits(parent + drm_edits(toolkit, host, gpu.pci_bus_id),
                 "made by nvcdi's rules (no spec entry names this GPU)")


def mig_capability_nodes(toolkit: Toolkit, host: HostFacts, gpu_minor: int, gi: int,
                         ci: int) -> tuple[DeviceNode, ...]:
    """The two capability nodes of GPU instance ``gi``'s compute instance ``ci``, typed so that the
    runtime makes them in the container (a host need not have them: NVIDIA's DRA driver's cdi.go)."""
    if host.mig_minors is None:
        raise NvidiaCdiError(f"{MIG_MINORS} does not exist: the NVIDIA driver here exposes no MIG capabilities"
                             " (is the nvidia-caps module loaded, and is MIG supported by this driver?).")
    keys = (f"gpu{gpu_minor}/gi{gi}/access", f"gpu{gpu_minor}/gi{gi}/ci{ci}/access")
    missing = [k for k in keys if k not in host.mig_minors]
    if missing:
        raise NvidiaCdiError(f"{MIG_MINORS} lists no capability for {', '.join(missing)}; the NVIDIA driver does"
                             " not expose this MIG instance.")
    minors = host.mig_minors

    def node(key: str) -> DeviceNode:
        path = f"{CAPS_DEVICE_DIR}/nvidia-cap{minors[key]}"
        if host.caps_major is None:  # no nvidia-caps in /proc/devices: only a spec can say
            found = toolkit.node(path)
            if found is None:
                raise NvidiaCdiError(f"/proc/devices lists no nvidia-caps device and no toolkit spec names {path}:"
                                     " the runtime could not make the MIG instance's capability node.")
            return found[0]
        # 0444: the mode nvidia-modprobe gives the capability nodes (what the DRA driver reads back
        # from /proc/driver/nvidia/capabilities/.../access as DeviceFileMode).
        return DeviceNode(path, type="c", major=host.caps_major, minor=minors[key], file_mode=0o444)

    return tuple(node(k) for k in keys)


def mig_edits(toolkit: Toolkit, gpu: GpuRef, mig: MigRef, host: HostFacts) -> Edits:
    """A MIG instance, static or dynamic: its parent's node and its two capability nodes from
    ``mig-minors`` (plus the DRM nodes of a ``+gfx`` profile), never its spec entry, which may lack
    the capability nodes (see the module's doc)."""
    edits = ContainerEdits(device_nodes=(gpu_device_node(toolkit, host, gpu.minor),
                                         *mig_capability_nodes(toolkit, host, gpu.minor, mig.gi, mig.ci)))
    if "+gfx" in mig.profile:
        edits += drm_edits(toolkit, host, gpu.pci_bus_id)
    return Edits(edits, "made by nvcdi's rules (the parent's node and the instance's capability nodes)")
