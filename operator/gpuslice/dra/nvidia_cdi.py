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
and each device's): the common edits copied from the best spec there is, the device's own edits
from a spec entry that names exactly that device (by UUID, or by index when its nodes prove it is
that GPU), and otherwise made by the rules above. The driver's libraries cannot be made: without a
spec holding common edits a prepare fails and says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from gpuslice.dra.cdi import CDI_VERSION, ContainerEdits, DeviceNode, newer_version

ACCEPTED = ("nvidia.com/gpu", "management.nvidia.com/gpu", "k8s.device-plugin.nvidia.com/gpu")
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
CAPS_DEVICE_DIR = "/dev/nvidia-caps"
MIG_MINORS = "/proc/driver/nvidia-caps/mig-minors"
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
MPS_PIPE_DIRECTORY = "/tmp/nvidia-mps"  # CUDA's default MPS pipe directory; the toolkit's IPC mount
GENERATE = ("`nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml` on the node (NVIDIA Container Toolkit"
            " 1.18+ runs it at boot as the nvidia-cdi-refresh service), or with the GPU Operator keep"
            " cdi.enabled=true (its toolkit writes /var/run/cdi/management.nvidia.com-gpu.yaml)")


class NvidiaCdiError(Exception):
    """A container cannot be given the device; the message says what is missing and the fix."""


@dataclass(frozen=True)
class ToolkitSpec:
    """One of the toolkit's spec files."""

    path: str
    kind: str
    version: str
    common: ContainerEdits
    devices: Mapping[str, ContainerEdits]


@dataclass(frozen=True)
class HostFacts:
    """What the node's /dev, /proc and /sys say (read by the agent).

    ``existing``: which of the control and GPU nodes exist; ``mig_minors``: the parsed
    ``mig-minors`` (None when the file is missing: no MIG here); ``caps_major``: the
    ``nvidia-caps`` major of ``/proc/devices``; ``drm``: DRM nodes by PCI bus id."""

    existing: frozenset[str] = frozenset()
    mig_minors: Mapping[str, int] | None = None
    caps_major: int | None = None
    drm: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class GpuRef:
    uuid: str
    index: int
    minor: int
    pci_bus_id: str


@dataclass(frozen=True)
class MigRef:
    uuid: str  # "" for an instance not made yet
    profile: str
    gi: int
    ci: int


@dataclass(frozen=True)
class Edits:
    """A device's edits, and where they come from (for the check and the logs)."""

    edits: ContainerEdits
    source: str


def parse_mig_minors(text: str) -> dict[str, int]:
    """``gpu0/gi1/access 12`` lines -> {"gpu0/gi1/access": 12} (nvcaps' ``processMinorsFile``)."""
    minors = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            minors[parts[0]] = int(parts[1])
    return minors


def parse_device_major(proc_devices: str, name: str = "nvidia-caps") -> int | None:
    """The major of a character device in ``/proc/devices`` (before its block devices)."""
    chars = proc_devices.split("Block devices:", 1)[0]
    for line in chars.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1] == name and parts[0].isdigit():
            return int(parts[0])
    return None


class Toolkit:
    """The toolkit's specs found on the node, best first."""

    def __init__(self, specs: Sequence[ToolkitSpec], searched: str) -> None:
        self.specs = tuple(sorted(specs, key=lambda s: (ACCEPTED.index(s.kind), s.path)))
        self.searched = searched

    def common(self) -> ToolkitSpec:
        """The spec whose common edits every claim copies; NvidiaCdiError when none has any."""
        for spec in self.specs:
            if spec.common.mounts or spec.common.hooks:
                return spec
        found = ", ".join(f"{s.path} ({s.kind}, no common edits)" for s in self.specs) or "none"
        raise NvidiaCdiError(
            f"no NVIDIA Container Toolkit CDI spec in {self.searched} holds the driver's libraries and hooks"
            f" (specs of kind {', '.join(ACCEPTED)} found: {found}), so a container would get the GPU's device"
            f" nodes but no libcuda.so, libnvidia-ml.so or nvidia-smi. Generate one: {GENERATE}.")

    def device(self, names: Sequence[str], proof: str) -> Edits | None:
        """A device entry named one of ``names`` whose nodes include ``proof`` (its ``/dev/nvidia<minor>``:
        an index-named entry of an older spec may be another GPU now)."""
        for spec in self.specs:
            for name in names:
                edits = spec.devices.get(name)
                if edits is not None and any(n.path == proof for n in edits.device_nodes):
                    return Edits(edits, f"{spec.path}: {spec.kind}={name}")
        return None


def common_edits(toolkit: Toolkit, host: HostFacts) -> tuple[ContainerEdits, str]:
    """The claim spec's common edits and the CDI version they need: the toolkit's, plus the control
    nodes it has not (a management spec keeps them in its ``all`` device), plus
    ``NVIDIA_VISIBLE_DEVICES=void`` where it does not set it; less the host's MPS pipe directory.

    The toolkit mounts ``/tmp/nvidia-mps`` into every container when it existed as the spec was
    generated (``internal/discover/ipc.go``, ``NewIPCDiscoverer``): copied into a claim, it would make
    the container a client of whatever MPS daemon the host runs there. gpuslice decides MPS per
    policy: its MPS clients get their own GPU's daemon (``planning.mps``), other containers none."""
    spec = toolkit.common()
    have = {n.path for n in spec.common.device_nodes}
    control = tuple(DeviceNode(p) for p in CONTROL_NODES if p in host.existing and p not in have)
    env = {} if VISIBLE_DEVICES in spec.common.env else {VISIBLE_DEVICES: "void"}
    common = replace(spec.common, mounts=tuple(m for m in spec.common.mounts
                                               if m.get("containerPath") != MPS_PIPE_DIRECTORY))
    return common + ContainerEdits(env=env, device_nodes=control), newer_version(CDI_VERSION, spec.version)


def gpu_node(minor: int) -> str:
    return f"/dev/nvidia{minor}"


def whole_gpu_edits(toolkit: Toolkit, gpu: GpuRef, host: HostFacts) -> Edits:
    """A whole GPU (a whole-GPU device, a memory slice or a shared device: the container gets the GPU)."""
    node = gpu_node(gpu.minor)
    found = toolkit.device((gpu.uuid, str(gpu.index)), node)
    if found is not None:
        return found
    nodes = (DeviceNode(node), *(DeviceNode(d) for d in host.drm.get(gpu.pci_bus_id, ())))
    return Edits(ContainerEdits(device_nodes=nodes), "made by nvcdi's rules (no spec entry names this GPU)")


def mig_capability_nodes(host: HostFacts, gpu_minor: int, gi: int, ci: int) -> tuple[DeviceNode, ...]:
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
        if host.caps_major is None:
            return DeviceNode(path)  # the runtime stats the host's node
        # 0444: the mode nvidia-modprobe gives the capability nodes (what the DRA driver reads back
        # from /proc/driver/nvidia/capabilities/.../access as DeviceFileMode).
        return DeviceNode(path, type="c", major=host.caps_major, minor=minors[key], file_mode=0o444)

    return tuple(node(k) for k in keys)


def mig_edits(toolkit: Toolkit, gpu: GpuRef, mig: MigRef, host: HostFacts) -> Edits:
    """A MIG instance: a static one the spec knows by its UUID is taken from there; any other (a
    dynamic instance is always newer than the spec) is made by nvcdi's rules."""
    node = gpu_node(gpu.minor)
    if mig.uuid:
        found = toolkit.device((mig.uuid,), node)
        if found is not None:
            return found
    nodes = [DeviceNode(node), *mig_capability_nodes(host, gpu.minor, mig.gi, mig.ci)]
    if "+gfx" in mig.profile:
        nodes += [DeviceNode(d) for d in host.drm.get(gpu.pci_bus_id, ())]
    return Edits(ContainerEdits(device_nodes=tuple(nodes)),
                 "made by nvcdi's rules (the parent's node and the instance's capability nodes)")
