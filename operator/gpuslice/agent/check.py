"""``gpuslice agent --backend nvml --check``: what gpuslice would see and publish on this machine,
read from NVML and the node's files, changing nothing.

The first thing to run on a machine with an NVIDIA GPU (``hack/nvidia/device-check.sh`` runs it
from a plain checkout). It prints the inventory, every attribute each kind of device would carry,
the MIG profiles and placements NVML reports and the instances that exist, NVML's memory figures
against the catalog's, the NVIDIA Container Toolkit's CDI specs and the edits each kind of device
would get, and ends with what is wrong. It needs no API server and reads no cluster.

**It cannot write to a GPU**: the backend is given :class:`ReadOnlyNvml`, which lets through only
the NVML functions in ``READ_CALLS`` (queries) and raises on any other, so a MIG mode switch or an
instance created by mistake fails before it reaches the driver. Nothing else is written either:
no CDI spec, no checkpoint, no state file.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any, cast

from gpuslice import __version__
from gpuslice.agent.gpus import GpuBackendError
from gpuslice.agent.gpus.nvidia_cdi import DEFAULT_SPEC_DIRS, load_toolkit
from gpuslice.agent.gpus.nvml import NvmlBackend
from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.dra.nvidia_cdi import (
    CONTROL_NODES,
    GpuRef,
    HostFacts,
    MigRef,
    common_edits,
    device_node,
    mig_edits,
    whole_gpu_edits,
)
from gpuslice.dra.nvidia_toolkit import NvidiaCdiError
from gpuslice.dra.wire import text_attribute
from gpuslice.errors import GpusliceError
from gpuslice.inventory.catalog import MI
from gpuslice.inventory.gpus import Gpu
from gpuslice.inventory.nodes import catalog_model, product_key
from gpuslice.planning.modes import MODES
from gpuslice.planning.node.gpu_use import parse_cgroup
from gpuslice.planning.node.mig_mode import switches_mig_mode
from gpuslice.planning.node.node_pool import MPS_MIN_COMPUTE_CAPABILITY, plan_node_pool

# The NVML functions the check may call: queries only (the backend's discovery and its listing of
# MIG instances). docs/nvidia.md lists them.
READ_CALLS = frozenset({
    "nvmlInit", "nvmlShutdown", "nvmlSystemGetDriverVersion", "nvmlSystemGetCudaDriverVersion",
    "nvmlSystemGetNVMLVersion", "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceGetUUID", "nvmlDeviceGetName", "nvmlDeviceGetBrand", "nvmlDeviceGetArchitecture",
    "nvmlDeviceGetCudaComputeCapability", "nvmlDeviceGetMinorNumber", "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetPciInfo", "nvmlDeviceGetMigMode", "nvmlDeviceGetGpuInstanceProfileInfo",
    "nvmlDeviceGetGpuInstancePossiblePlacements", "nvmlDeviceGetGpuInstances", "nvmlGpuInstanceGetInfo",
    "nvmlGpuInstanceGetComputeInstanceProfileInfo", "nvmlGpuInstanceGetComputeInstances",
    "nvmlComputeInstanceGetInfo", "nvmlDeviceGetMaxMigDeviceCount", "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceGetGpuInstanceId", "nvmlDeviceGetComputeInstanceId",
    # what runs on each GPU, for each pod's use (agent.usage)
    "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetMPSComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2", "nvmlDeviceGetMPSComputeRunningProcesses_v2",  # before R510
    "nvmlDeviceGetProcessUtilization",
    # where each GPU sits (inventory.topology): its NUMA node where sysfs does not say, its NVLinks
    "nvmlDeviceGetMemoryAffinity", "nvmlDeviceGetNvLinkState", "nvmlDeviceGetNvLinkRemotePciInfo",
    "nvmlDeviceGetNvLinkRemoteDeviceType",
})
_NAME = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z_][A-Za-z0-9_]{0,31}$")
KERNEL_DEVICES = ("nvidia", "nvidia-frontend", "nvidia-uvm", "nvidia-caps", "drm")
HOST_ROOT = Path("/")  # where the host's files are seen: device-check.sh runs the check on the host
_SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)$")


class WriteRefused(GpusliceError, RuntimeError):
    """The check tried an NVML call that is not a query."""


class ReadOnlyNvml:
    """pynvml, with only its query functions: constants, types and error classes pass through."""

    def __init__(self, nvml: ModuleType) -> None:
        self._nvml = nvml
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._nvml, name)
        if not (name.startswith("nvml") and callable(value)):
            return value
        if name not in READ_CALLS:
            raise WriteRefused(f"the read-only check may not call {name}: it is not a query of the GPU")

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return value(*args, **kwargs)

        return call


def _policy(name: str, slicing: dict[str, Any]) -> GpuSlicePolicy:
    return GpuSlicePolicy.model_validate({"metadata": {"name": name, "creationTimestamp": "2026-01-01T00:00:00Z"},
                                          "spec": {"slicing": slicing}})


def attribute_problems(device: dict[str, Any]) -> list[str]:
    """What the API server would refuse in a device's attributes and capacities (resource.k8s.io/v1)."""
    problems = []
    attributes, capacity = device.get("attributes") or {}, device.get("capacity") or {}
    if len(attributes) + len(capacity) > 32:
        problems.append(f"{len(attributes) + len(capacity)} attributes and capacities (at most 32)")
    for name, value in attributes.items():
        if not _NAME.match(name):
            problems.append(f"attribute name {name!r} is not a C identifier of at most 32 characters")
        text = value.get("string", value.get("version"))
        if isinstance(text, str) and len(text) > 64:
            problems.append(f"{name}: {text!r} is longer than 64 characters")
        if "version" in value and not _SEMVER.match(str(value["version"])):
            problems.append(f"{name}: {value['version']!r} is not semver 2.0")
    return problems


class Report:
    def __init__(self, out: Callable[[str], None]) -> None:
        self.out = out
        self.problems: list[str] = []

    def line(self, text: str = "") -> None:
        self.out(text)

    def problem(self, text: str) -> None:
        self.problems.append(text)
        self.out(f"  PROBLEM: {text}")


def _inventory(report: Report, gpus: list[Gpu]) -> None:
    report.line(f"== Inventory: {len(gpus)} GPUs")
    for gpu in gpus:
        model = catalog_model(gpu.product_name)
        report.line(f"GPU {gpu.index} (minor {gpu.minor}) {gpu.uuid}")
        report.line(f"  product {gpu.product_name!r}; GFD labels it {product_key(gpu.product_name)!r}; catalog:"
                    f" {model.key if model else 'not in the catalog (the controller judges it by its labels)'}")
        report.line(f"  memory {gpu.memory // MI} MiB" + (
            f" (catalog {model.memory // MI} MiB: {'same' if model.memory == gpu.memory else 'DIFFERS'})"
            if model else ""))
        if model is not None and model.memory != gpu.memory:
            report.problem(f"GPU {gpu.index}: NVML reports {gpu.memory // MI} MiB, the catalog's {model.key}"
                           f" {model.memory // MI} MiB: the fake backend and the controller's judgement are off")
        report.line(f"  {gpu.brand}, {gpu.architecture}, compute capability {gpu.compute_capability}, driver"
                    f" {gpu.driver_version}, CUDA {gpu.cuda_driver_version}")
        report.line(f"  PCI bus id {gpu.pci_bus_id}, PCIe root {gpu.pcie_root or '(none: sysfs did not say)'}")
        numa = gpu.numa_node if gpu.numa_node is not None else "(none: neither sysfs nor NVML said)"
        report.line(f"  NUMA node {numa}, NVLink domain {gpu.nvlink_domain or '(none: no NVLink all-to-all)'}")
        if not gpu.mig_capable:
            report.line("  MIG: not supported")
            continue
        switch = ("the agent switches it as a policy needs (Hopper or later)" if switches_mig_mode(gpu) else
                  "only a GPU reset switches it, which the agent does not do")
        report.line(f"  MIG: capable, mode {'enabled' if gpu.mig_enabled else 'disabled'}; {switch}")
        if not gpu.mig_enabled and not switches_mig_mode(gpu):
            report.line("  so MIG policies publish nothing on it until an admin enables MIG mode and resets it")


def _mig(report: Report, backend: NvmlBackend, gpus: list[Gpu]) -> None:
    report.line("== MIG profiles and placements NVML reports")
    for gpu in (g for g in gpus if g.mig_capable):
        model = catalog_model(gpu.product_name)
        report.line(f"GPU {gpu.index} ({gpu.product_name}):")
        for profile in gpu.mig_profiles:
            engines = profile.engines
            shown = (f"{engines.multiprocessors} SMs, CE {engines.copy_engines}, DEC {engines.decoders}, ENC"
                     f" {engines.encoders}, JPEG {engines.jpeg_engines}, OFA {engines.ofa_engines}" if engines else "")
            report.line(f"  {profile.name:<14} {profile.memory // MI:>7} MiB  up to {profile.max_count}  {shown}"
                        f"  placements {', '.join(f'{s}+{profile.size}' for s in profile.starts)}")
            if model is None:
                continue
            known = model.mig_profile(profile.name)
            if known is None:
                report.problem(f"GPU {gpu.index}: profile {profile.name} is not in the catalog's {model.key}")
            elif known != profile:
                report.problem(f"GPU {gpu.index}: profile {profile.name} differs from the catalog's {model.key}"
                               f" (NVML {profile}; catalog {known})")
        if model is not None:
            for missing in {p.name for p in model.mig_profiles} - {p.name for p in gpu.mig_profiles}:
                report.problem(f"GPU {gpu.index}: the catalog's {model.key} has {missing}, NVML does not")
        try:
            _nvml_views(report, backend, gpu)
        except GpuBackendError as error:
            report.problem(f"GPU {gpu.index} MIG: {error}")


def _nvml_views(report: Report, backend: NvmlBackend, gpu: Gpu) -> None:
    """NVML's own names of the profiles and the instances that exist (each an NVML query that may fail)."""
    # The profiles come from NVML's v1 query, named as go-nvlib names them; the versioned query
    # names them itself, but only in MIG mode (nvml.h).
    versioned = backend.versioned_profile_names(gpu)
    if gpu.mig_profiles and all(v is None for v in versioned.values()):
        report.line("  NVML's versioned profile query: NOT_SUPPORTED with MIG mode off (so the v1 query is used)")
    for name, nvml_name in sorted(versioned.items()):
        if nvml_name is not None and nvml_name.removeprefix("MIG ").strip() != name:
            report.problem(f"GPU {gpu.index}: profile {name} (go-nvlib's name) is {nvml_name!r} to NVML")
    instances = backend.mig_instances(gpu) if gpu.mig_enabled else []
    report.line(f"  instances now: {len(instances)}" + ("" if gpu.mig_enabled else " (MIG mode is off)"))
    for i in instances:
        report.line(f"    {i.profile} at {i.start}+{i.size}: GPU instance {i.gi}, compute instance {i.ci},"
                    f" {i.uuid}")


def _attributes(report: Report, gpus: list[Gpu]) -> None:
    report.line("== Attributes each kind of device would carry (as published in its ResourceSlice)")
    for gpu in gpus[:1] + [g for g in gpus[1:] if g.product_name != gpus[0].product_name]:
        kinds: dict[str, dict[str, Any]] = {}
        for mode in MODES.values():
            slicing = mode.example(gpu)
            if slicing is None:
                continue
            # In the MIG mode the mode needs, whatever the GPU's is now (the inventory says whether
            # the agent may switch it).
            trial = [replace(gpu, mig_enabled=mode.traits.instances)]
            for device in plan_node_pool({}, trial, [_policy(f"check-{mode.name}", slicing)]).devices:
                # NVIDIA's attributes, unqualified (the driver's domain).
                kind = (f"mig {text_attribute(device, 'profile', domain='')}" if mode.traits.instances
                        else text_attribute(device, "type", domain=""))
                kinds.setdefault(kind, device)
        for kind, device in kinds.items():
            report.line(f"GPU {gpu.index}, {kind} device {device['name']}:")
            report.line("  " + json.dumps({"attributes": device["attributes"], "capacity": device["capacity"]},
                                          sort_keys=True))
            for problem in attribute_problems(device):
                report.problem(f"GPU {gpu.index} {kind} device: {problem}")


def _cdi(report: Report, backend: NvmlBackend, gpus: list[Gpu]) -> None:
    report.line("== CDI: the NVIDIA Container Toolkit's specs and what each kind of device would get")
    driver = gpus[0].driver_version if gpus else None
    toolkit = load_toolkit(backend.cdi_dirs, driver)
    host: HostFacts = backend.host(gpus)
    report.line(f"specs in {toolkit.searched}, best first, for driver {driver}: " + (", ".join(
        f"{s.path} ({s.kind}, cdiVersion {s.version}, driver {s.driver_version or '(does not say)'},"
        f" {len(s.devices)} devices, {len(s.common.mounts)} mounts, {len(s.common.hooks)} hooks)"
        for s in toolkit.specs) or "none"))
    for spec in toolkit.stale():
        report.problem(f"{spec.path} is a CDI spec of driver {spec.driver_version}, the driver is {driver}: gpuslice"
                       " does not copy from it, and containers given its devices would miss their libraries;"
                       " generate it again or remove it")
    roots = ", ".join(sorted(toolkit.dev_roots())) or "?"
    majors = ", ".join(f"{n} {host.majors[n]}" for n in KERNEL_DEVICES if n in host.majors) or "no NVIDIA device"
    report.line(f"where the specs say the host keeps its device nodes: {roots}")
    mig_minors = "present" if host.mig_minors is not None else "absent"
    report.line(f"kernel (/proc/devices): {majors}; mig-minors: {mig_minors}")
    for path in CONTROL_NODES:
        control = device_node(toolkit, host, path)
        report.line(f"  {path}: " + (f"{json.dumps(control.node.manifest(), sort_keys=True)} ({control.source})"
                                     if control else "not given (the kernel has no such device, no spec names it)"))
        if path in host.seen and control is None:
            report.line("    (this container has it, the kernel does not list it: not given to containers)")
    try:
        common = common_edits(toolkit, host)
        report.line("common edits each claim's spec copies (the claim's spec says the cdiVersion its content needs):")
        report.line("  " + json.dumps(common.manifest(), sort_keys=True))
    except NvidiaCdiError as error:
        report.problem(str(error))
    for gpu in gpus:
        ref = GpuRef(gpu.uuid, gpu.index, gpu.minor, gpu.pci_bus_id)
        try:
            found = whole_gpu_edits(toolkit, ref, host)
            report.line(f"GPU {gpu.index}, a whole GPU, memory slice or shared device ({found.source}):")
            report.line("  " + json.dumps(found.edits.manifest(), sort_keys=True))
        except NvidiaCdiError as error:  # no spec names it (a GPU in MIG mode has no entry) and no major to type it
            report.problem(f"GPU {gpu.index} as a whole GPU: {error}")
        if not gpu.mig_capable:
            continue
        try:
            instances = backend.mig_instances(gpu) if gpu.mig_enabled else []
            for i in instances:
                edits = mig_edits(toolkit, ref, MigRef(i.profile, i.gi, i.ci), host)
                report.line(f"GPU {gpu.index}, MIG instance {i.profile} at {i.start} ({edits.source}):")
                report.line("  " + json.dumps(edits.edits.manifest(), sort_keys=True))
            # A dynamic instance gets its GPU and compute instance ids when it is made; GPU instance 1,
            # compute instance 0 is what the first one on an empty GPU gets.
            example = mig_edits(toolkit, ref, MigRef(gpu.mig_profiles[0].name if gpu.mig_profiles else "", 1, 0),
                                host)
            report.line(f"GPU {gpu.index}, a dynamic MIG instance (for example GPU instance 1, compute instance 0;"
                        f" {example.source}):")
            report.line("  " + json.dumps(example.edits.manifest(), sort_keys=True))
        except (NvidiaCdiError, GpuBackendError) as error:
            report.problem(f"GPU {gpu.index} MIG devices: {error}")


def _mps(report: Report, backend: NvmlBackend, gpus: list[Gpu]) -> None:
    """Whether this node can run MPS for policies with ``slicing.isolation: MPS``: the control binary
    found (never run: the check starts nothing), and which GPUs are Volta or newer."""
    report.line("== MPS (slicing.isolation: MPS): found, not started")
    control = backend.mps_control()
    if control is None:
        report.line(f"nvidia-cuda-mps-control: not on PATH nor under {backend.driver_root} (usr/bin, bin,"
                    " usr/local/bin, usr/sbin): policies with isolation MPS cannot prepare here; the nvidia runtime"
                    " class mounts it, or set --nvidia-driver-root")
    else:
        report.line(f"nvidia-cuda-mps-control: {control}")
    for gpu in gpus:
        volta = int(gpu.compute_capability.split(".")[0] or 0) >= MPS_MIN_COMPUTE_CAPABILITY
        what = "per-client memory and thread limits (Volta MPS)" if volta else "older than Volta: no MPS devices"
        report.line(f"GPU {gpu.index}: compute capability {gpu.compute_capability}: {what}")


def _processes(report: Report, backend: NvmlBackend, gpus: list[Gpu]) -> None:
    """What each pod's use is measured from: NVML's processes per GPU and the pod each one's cgroup
    names (read from this machine's /proc: run the check in the host's PID namespace to see pods')."""
    report.line("== Processes (each pod's GPU use): NVML's, and the pod of each as its cgroup says")
    for gpu in gpus:
        try:
            found = backend.processes(gpu)
        except GpuBackendError as error:
            report.problem(f"GPU {gpu.index} processes: {error}")
            continue
        report.line(f"GPU {gpu.index}: {len(found)} processes")
        for process in found:
            try:
                cgroup = parse_cgroup((backend.proc / str(process.pid) / "cgroup").read_text())
            except OSError:
                cgroup = None
            owner = f"pod UID {cgroup.pod_uid}" if cgroup else "no pod (or not in this PID namespace)"
            sm = "" if process.sm is None else f", SM {process.sm:.0%}"
            report.line(f"  pid {process.pid}: {process.used // MI} MiB{sm}; {owner}")


def _hooks(report: Report, backend: NvmlBackend, host_root: Path, driver: str | None) -> None:
    """Each hook the specs gpuslice copies from would run: the container runtime runs it from the
    host's filesystem, so a path the host lacks fails every container given a device at create.
    ``nvidia-ctk cdi generate`` writes ``/usr/bin/nvidia-cdi-hook`` unless told
    ``--nvidia-cdi-hook-path``; the GPU Operator's toolkit keeps it in /usr/local/nvidia/toolkit."""
    report.line(f"== CDI hooks: each path, as seen under {host_root}")
    toolkit = load_toolkit(backend.cdi_dirs, driver)
    paths: dict[str, str] = {}
    for spec in toolkit.usable():
        for edits in (spec.common, *spec.devices.values()):
            for hook in edits.hooks:
                paths.setdefault(str(hook.get("path") or ""), spec.path)
    for path, spec_path in sorted(paths.items()):
        found = host_root / path.lstrip("/")
        if path and found.is_file():
            report.line(f"  {path}: present ({spec_path})")
            continue
        report.problem(
            f"{spec_path} names the hook {path or '(no path)'}, which {found} is not: the container runtime runs"
            " hooks from the host's filesystem, so every container given a GPU would fail at create (if this"
            " check runs on the host). Generate the spec with the hook's real path, on a GPU Operator node"
            " `nvidia-ctk cdi generate --nvidia-cdi-hook-path=/usr/local/nvidia/toolkit/nvidia-cdi-hook"
            " --driver-root=/run/nvidia/driver ...` (docs/nvidia.md)")


def run_check(nvml: ModuleType, cdi_dirs: Iterable[Path] | None, out: Callable[[str], None] = print,
              driver_root: Path | None = None, host_root: Path | None = None, **host: Path) -> int:
    """Print the check; 0 when nothing is wrong, 1 otherwise. ``driver_root``: where NVML is loaded
    from (``--nvidia-driver-root``: the GPU Operator's containerised driver); ``host_root``: where
    the host's files are seen (the CDI hooks' paths); ``host``: other roots for /dev, /proc and /sys
    (tests)."""
    guarded = ReadOnlyNvml(nvml)
    report = Report(out)
    report.line(f"gpuslice {__version__} read-only GPU check (nvidia-ml-py"
                f" {getattr(nvml, '__version__', None) or _version('nvidia-ml-py')}); nothing is written")
    report.line("skipped: everything that needs an API server (the Node's GFD labels, policies, other drivers'"
                " ResourceSlices); this check reads NVML and this machine's files only")
    if driver_root is not None:
        report.line(f"NVML from the driver's root {driver_root}")
    try:
        backend = NvmlBackend(cast(ModuleType, guarded), cdi_dirs=tuple(cdi_dirs or DEFAULT_SPEC_DIRS),
                              dev=host.get("dev", Path("/dev")), proc=host.get("proc", Path("/proc")),
                              sysfs=host.get("sysfs", Path("/sys")), driver_root=driver_root)
        gpus = backend.discover()
    except GpuBackendError as error:
        report.problem(str(error))
        return 1
    for refused in backend.refused:
        report.problem(refused)
    for part in (_inventory, _attributes):
        part(report, gpus)
    for io_part in (_mig, _cdi, _mps, _processes):
        io_part(report, backend, gpus)
    _hooks(report, backend, host_root or HOST_ROOT, gpus[0].driver_version if gpus else None)
    report.line(f"== NVML calls made: {', '.join(sorted(set(guarded.calls)))}")
    report.line(f"== {len(report.problems)} problems" + "".join(f"\n- {p}" for p in report.problems))
    return 1 if report.problems else 0


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "?"
