"""Everything the node agent can be told, in one place (flags and ``GPUSLICE_*`` environment variables).

``AgentSettings`` is the documented model (``docs/configuration.md`` is generated from it);
``health.HealthSettings`` and ``kubeletplugin.settings.PluginSettings`` are the parts the health monitor
and the kubelet plugin take, derived from it (each beside what takes it, so neither imports this module).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from gpuslice.agent.health import HealthSettings
from gpuslice.agent.kubeletplugin.settings import PluginSettings
from gpuslice.settings import ProcessSettings

_PLUGIN, _HEALTH = PluginSettings(), HealthSettings()
NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


class AgentSettings(ProcessSettings):
    node: str = Field(description=(
        "This node's name: the agent publishes only its pool and may write only its own node's slices"
        " (a DaemonSet sets it from spec.nodeName)."), json_schema_extra={"env_aliases": ["NODE_NAME"]})
    backend: Literal["nvml", "fake"] = Field(default="nvml", description=(
        "Where GPUs come from: nvml (the NVIDIA driver) or fake (kind and the dev cluster; state in state_dir)."))
    fake_gpus: str | None = Field(default=None, description=(
        "Fake backend: MODEL:COUNT[:mig-off|:mig-on][,MODEL:COUNT...] (the MIG mode MIG-capable GPUs start"
        " in; by default on before Hopper, off from Hopper on), or a whole system with its NUMA nodes, PCIe roots"
        " and NVLink (dgx-h100, pcie-l40s, h100-nvl); unset: the node's gpuslice.dev/fake-* labels."))
    nvidia_cdi_dir: tuple[Path, ...] = Field(default=(), description=(
        "NVML backend: where the NVIDIA Container Toolkit's CDI specs are (nvidia.com/gpu,"
        " management.nvidia.com/gpu or k8s.device-plugin.nvidia.com/gpu), whose libraries and hooks each claim's"
        " spec copies (repeat the flag; in the variable, separated by ':'; a later one wins, as in CDI); unset:"
        " /etc/cdi, then /var/run/cdi."))
    nvidia_driver_root: Path | None = Field(default=None, description=(
        "NVML backend: the NVIDIA driver's root as mounted in the agent's container (the host's / or the GPU"
        " Operator's /run/nvidia/driver; the chart's nvidiaDriverRoot): NVML is loaded from it, and"
        " nvidia-cuda-mps-control is looked for in its usr/bin, bin, usr/local/bin and usr/sbin when it is not"
        " on PATH. Unset: both from the container's own paths, where the NVIDIA Container Toolkit's runtime"
        " puts them."))
    metrics_port: int | None = Field(default=None, ge=1, le=65535, description=(
        "Serve /metrics, /healthz and /readyz on this port; off when unset (the probes need it)."))
    kubelet_registrar_dir: Path = Field(default=_PLUGIN.registrar_dir, description=(
        "The kubelet's plugin registry: the plugin's registration socket goes here."))
    kubelet_plugins_dir: Path = Field(default=_PLUGIN.plugins_dir, description=(
        "The kubelet's plugins directory: the service socket goes in its gpu.gpuslice.dev/."))
    cdi_dir: Path = Field(default=_PLUGIN.cdi_dir, description=(
        "Where the container runtime reads CDI specs (containerd 2's default): one spec per prepared claim."))
    state_dir: Path | None = Field(default=None, description=(
        "Claim checkpoints, the record of what was published, fake GPU state; unset: the driver's directory"
        " under kubelet_plugins_dir, which survives the agent's restarts with the node."))
    boot_id_file: Path = Field(default=_PLUGIN.boot_id_file, description=(
        "Where the node's boot ID is read (the kernel's, the same in every container): claim checkpoints"
        " from an earlier boot are undone, since what they record did not survive the reboot."))
    resync: float = Field(default=60.0, gt=0, description=(
        "Seconds between full checks of the pool when nothing wakes the agent; also how often claims the"
        " kubelet never unprepared are swept. Watches wake it at once on every change that matters."))
    debounce: float = Field(default=0.3, ge=0, description=(
        "Seconds a wake-up waits for more events, so that a burst (a policy edit, a node relabelled) costs"
        " one publish cycle."))
    max_backoff: float = Field(default=10.0, ge=1, description=(
        "Seconds between tries of a failing publish cycle, at most (from 1 s, doubling); news from the"
        " watches cuts the wait short."))
    ready_within: float = Field(default=120.0, gt=0, description=(
        "/readyz fails when no publish cycle has succeeded for this many seconds (or 3 resyncs, if longer):"
        " an agent that cannot publish is not ready, even if it is alive."))
    health_interval: float = Field(default=_HEALTH.interval, gt=0, description=(
        "Seconds between checks of the GPUs' health (NVML events and queries)."))
    health_recovery: float = Field(default=_HEALTH.recovery, ge=0, description=(
        "Seconds an unhealthy GPU must go without a fault before its taint is lifted: a flapping GPU does"
        " not churn the slices."))
    mps_dir: Path | None = Field(default=None, description=(
        "Where the MPS control daemons (one per GPU and tenant namespace, for policies with"
        " slicing.isolation: MPS) keep their pipe and log directories, mounted into their clients; keep it"
        " short (its sockets must fit a unix socket path's 107 bytes); unset: mps/ in state_dir."))
    mps_shm_dir: Path = Field(default=_PLUGIN.mps_shm_dir, description=(
        "Where each MPS control daemon's shared-memory directory is made (one per GPU and tenant namespace):"
        " /dev/shm of the daemon and of its client containers. Keep it on a tmpfs (the host's /dev/shm)."))
    pod_resources_socket: Path = Field(default=Path("/var/lib/kubelet/pod-resources/kubelet.sock"), description=(
        "The kubelet's PodResources API: which container of which pod holds which gpuslice device, for each"
        " pod's GPU use."))
    host_proc: Path = Field(default=Path("/proc"), description=(
        "The node's /proc: each GPU process's cgroup names its pod. NVML numbers a GPU's processes in the"
        " agent's own PID namespace and lists only those it sees there, so the DaemonSet runs the agent with"
        " hostPID: true and mounts the host's /proc at /host/proc; at start the agent compares the two and"
        " says so (log, Node Event GpuProcessesNotVisible) when they differ. The NVML backend also reads the"
        " kernel's devices and nvidia-caps/mig-minors there (the same in every PID namespace)."))
    usage_interval: float = Field(default=10.0, ge=0, description=(
        "Seconds between measurements of each pod's GPU use (NVML's processes against the pods' allocations:"
        " metrics and overuse); 0 turns them off."))
    overuse_tolerance: float = Field(default=5.0, ge=0, description=(
        "Percent of its allocation a pod may use beyond it on a GPU before it counts as overusing (CUDA's own"
        " context memory, allocator rounding)."))
    overuse_grace: float = Field(default=30.0, ge=0, description=(
        "Seconds a pod must stay over its allocation (beyond the tolerance) before it is reported, and evicted"
        " where its policy says onOveruse: Evict."))
    mps_daemon_args: tuple[str, ...] = Field(default=(), description=(
        "NVML backend: more arguments for nvidia-cuda-mps-control (repeat the flag; in the variable, separated by"
        " spaces), e.g. its multi-user flag where tenants' containers run as different users (the driver's"
        " documentation names it; NVIDIA's DRA driver passes -M)."))
    mps_check_interval: float = Field(default=2.0, gt=0, description=(
        "Seconds between checks that every GPU and tenant namespace with MPS devices prepared has its"
        " control daemon running (a dead one is started again)."))

    @field_validator("node")
    @classmethod
    def _node_name(cls, node: str) -> str:
        # It goes into API paths and slice names: only what Kubernetes allows a Node's name (a DNS subdomain).
        if len(node) > 253 or not NODE_NAME.fullmatch(node):
            raise ValueError(f"{node!r} is not a Node's name (lowercase letters, digits, '-' and '.'): pass --node or"
                             " set NODE_NAME (a DaemonSet: from spec.nodeName)")
        return node

    @model_validator(mode="after")
    def _fields(self) -> AgentSettings:
        if self.fake_gpus is not None and self.backend != "fake":
            raise ValueError("--fake-gpus is for --backend fake")
        if self.nvidia_cdi_dir and self.backend != "nvml":
            raise ValueError("--nvidia-cdi-dir is for --backend nvml")
        if self.nvidia_driver_root is not None and self.backend != "nvml":
            raise ValueError("--nvidia-driver-root is for --backend nvml")
        if self.mps_daemon_args and self.backend != "nvml":
            raise ValueError("--mps-daemon-args is for --backend nvml")
        return self

    @property
    def plugin(self) -> PluginSettings:
        return PluginSettings(self.kubelet_registrar_dir, self.kubelet_plugins_dir, self.cdi_dir, self.state_dir,
                              self.boot_id_file, self.mps_dir, self.mps_shm_dir)

    @property
    def health(self) -> HealthSettings:
        return HealthSettings(self.health_interval, self.health_recovery)

    @property
    def readiness_window(self) -> float:
        return max(self.ready_within, 3 * self.resync)
