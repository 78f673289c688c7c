"""Real GPUs through NVML (``pynvml`` from nvidia-ml-py).

Discovery changes no GPU setting. MIG instances are made and destroyed only on
behalf of the kubelet plugin (dynamic MIG) and the MIG manager (static layouts).
Health comes from NVML's event set (XID and double-bit ECC events, watched in a
thread) and from probing each GPU, which answers ``GPU is lost`` once it fell off
the bus. A container is given the NVIDIA Container Toolkit's CDI device for its
GPU (``nvidia_cdi``), next to gpuslice's own spec.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import shutil
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import structlog

from gpuslice.agent.gpus import Access, Fault, GpuBackendError, GpuProcess, MigInstance
from gpuslice.agent.gpus.nvidia_cdi import DEFAULT_SPEC_DIRS, host_facts, load_toolkit
from gpuslice.dra.nvidia_cdi import (
    GpuRef,
    HostFacts,
    MigRef,
    common_edits,
    mig_edits,
    whole_gpu_edits,
)
from gpuslice.dra.nvidia_toolkit import NvidiaCdiError
from gpuslice.inventory.catalog import Engines, MigProfile
from gpuslice.inventory.gpus import Gpu
from gpuslice.inventory.nodes import catalog_model
from gpuslice.inventory.pci import PciAddressError, normalized_bus_id, pcie_root
from gpuslice.inventory.topology import LinkKind, NvLink, nvlink_domains
from gpuslice.planning.grants import Grant
from gpuslice.planning.node.mig_mode import switches_mig_mode

log = structlog.get_logger(__name__)
# go-nvlib's strings for NVML's enums (pkg/nvlib/device/device.go: GetArchitectureAsString,
# GetBrandAsString), which NVIDIA's DRA driver publishes as `architecture` and `brand`.
ARCHITECTURES = {2: "Kepler", 3: "Maxwell", 4: "Pascal", 5: "Volta", 6: "Turing", 7: "Ampere",
                 8: "Ada Lovelace", 9: "Hopper", 10: "Blackwell", 13: "Rubin", 0xFFFFFFFF: "Unknown"}
BRANDS = {0: "Unknown", 1: "Quadro", 2: "Tesla", 3: "NVS", 4: "Grid", 5: "GeForce", 6: "Titan", 7: "NvidiaVApps",
          8: "NvidiaVPC", 9: "NvidiaVCS", 10: "NvidiaVWS", 11: "NvidiaCloudGaming", 12: "QuadroRTX",
          13: "NvidiaRTX", 14: "Nvidia", 15: "GeForceRTX", 16: "TitanRTX"}
MPS_CONTROL = "nvidia-cuda-mps-control"
MPS_SEARCH = ("usr/bin", "bin", "usr/local/bin", "usr/sbin")
# NVML's process lists (compute, then MPS clients): the _v3 symbols, and the _v2 ones a driver before R510 has.
# Versioned: pynvml's unversioned wrappers turn a missing symbol into NVMLLibraryMismatchError, no NVMLError.
PROCESS_LISTS = (("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"),
                 ("nvmlDeviceGetMPSComputeRunningProcesses_v3", "nvmlDeviceGetMPSComputeRunningProcesses_v2"))
MAX_PLACEMENTS = 16
MAX_INSTANCES = 8
# Application errors, not the GPU's (the NVIDIA DRA driver ignores the same): graphics engine
# exceptions, page faults, preempted or reset channels, a killed context.
IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})
LOST_XIDS = frozenset({79})  # fell off the bus
# go-nvlib's MIG profile names (pkg/nvlib/device/mig_profile.go, NewMigProfile), as NVIDIA's DRA driver
# publishes them: GPU slices and attribute by NVML's GPU instance profile enum (3_SLICE_GFX, which
# go-nvlib does not list yet, named by the same rule).
GI_PROFILES = {"1_SLICE": (1, ""), "1_SLICE_REV1": (1, "+me"), "1_SLICE_REV2": (1, ""), "1_SLICE_GFX": (1, "+gfx"),
               "1_SLICE_NO_ME": (1, "-me"), "1_SLICE_ALL_ME": (1, "+me.all"), "2_SLICE": (2, ""),
               "2_SLICE_REV1": (2, "+me"), "2_SLICE_GFX": (2, "+gfx"), "2_SLICE_NO_ME": (2, "-me"),
               "2_SLICE_ALL_ME": (2, "+me.all"), "3_SLICE": (3, ""), "3_SLICE_GFX": (3, "+gfx"), "4_SLICE": (4, ""),
               "4_SLICE_GFX": (4, "+gfx"), "6_SLICE": (6, ""), "7_SLICE": (7, ""), "8_SLICE": (8, "")}
# One per GPU instance size GI_PROFILES names (6 and 8: GPUs of eight slices); a constant the installed
# pynvml lacks is skipped (_compute_profile).
COMPUTE_PROFILES = {1: "NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE", 2: "NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE",
                    3: "NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE", 4: "NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE",
                    6: "NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE", 7: "NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE",
                    8: "NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE"}


# Where a driver's root holds libnvidia-ml.so.1 (Debian/Ubuntu per architecture, RHEL, the rest).
NVML_LIBRARY_DIRS = ("usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib64", "usr/lib",
                     "lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu", "lib64", "lib")
NVML_LIBRARY = "libnvidia-ml.so.1"


def load_nvml_from(root: Path, loader: Callable[..., Any] = ctypes.CDLL) -> Path:
    """Load NVML from a driver's root (``--nvidia-driver-root``), before pynvml asks for it.

    pynvml opens ``libnvidia-ml.so.1`` by that name; the dynamic loader answers such a request with
    a library already loaded under that soname, so loading the root's copy first makes pynvml use it
    without the library path naming the root (NVIDIA's own DRA driver finds it the same way)."""
    for directory in NVML_LIBRARY_DIRS:
        path = root / directory / NVML_LIBRARY
        if path.exists():
            try:
                loader(str(path), mode=ctypes.RTLD_GLOBAL)
            except OSError as error:
                raise GpuBackendError(f"could not load NVML from {path} ({error}): is --nvidia-driver-root"
                                      f" ({root}) the driver's root, for this architecture?") from error
            log.info("NVML loaded from the driver's root", path=str(path))
            return path
    raise GpuBackendError(
        f"no {NVML_LIBRARY} under --nvidia-driver-root {root} (looked in {', '.join(NVML_LIBRARY_DIRS)}): set it to"
        " where the driver is on the host, as mounted in the agent (/ for a driver installed on the node,"
        " /run/nvidia/driver for the GPU Operator's), or leave it unset to use the NVIDIA Container Toolkit's.")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def mig_memory_gb(device_memory: int, profile_mb: int) -> int:
    """go-nvlib's ``getMigMemorySizeGB``: the profile's share of the GPU in eighths, rounded up, times
    the GPU's whole GiB, rounded half away from zero (Go's math.Round): 71168 MiB of an H200's
    143771 MiB is 4/8 of 141 GiB, 70.5, so ``3g.71gb``."""
    fraction = math.ceil(float(profile_mb) * 1024**2 / float(device_memory) * 8) / 8
    return math.floor(fraction * float((device_memory + 1024**3 - 1) // 1024**3) + 0.5)


class NvmlBackend:
    name = "nvml"

    def __init__(self, nvml: ModuleType | None = None, cdi_dirs: tuple[Path, ...] = DEFAULT_SPEC_DIRS,
                 dev: Path = Path("/dev"), proc: Path = Path("/proc"), sysfs: Path = Path("/sys"),
                 driver_root: Path | None = None, mps_args: tuple[str, ...] = ()) -> None:
        if driver_root is not None:
            load_nvml_from(driver_root)
        if nvml is None:
            import pynvml

            nvml = pynvml
        self.nvml: Any = nvml  # pynvml is untyped; the stand-in in tests is a plain module
        self.cdi_dirs, self.dev, self.proc, self.sysfs = cdi_dirs, dev, proc, sysfs
        # Where the MPS binaries are looked for after PATH: the driver's root, else the container's own.
        self.driver_root, self.mps_args = driver_root or Path("/"), mps_args
        self._utilization_seen: dict[str, int] = {}  # GPU UUID -> NVML's timestamp of the last sample read
        self._profile_ids: dict[tuple[str, str], int] = {}  # (GPU UUID, profile) -> NVML profile enum
        self._events: dict[str, Fault] = {}
        self._events_lock = threading.Lock()
        self.refused: list[str] = []  # what NVML refused this process at discovery (not root), for the check
        self._watcher: threading.Thread | None = None

    @contextlib.contextmanager
    def _session(self, what: str, hint: str = "") -> Iterator[Any]:
        """NVML initialised for one operation (nvmlInit counts references); errors made clear."""
        nvml = self.nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as error:
            raise GpuBackendError(
                f"NVML could not start ({error}): no NVIDIA driver on this node, or the agent's container"
                " lacks the driver libraries. On a node without GPUs use --backend fake."
            ) from error
        try:
            yield nvml
        except nvml.NVMLError as error:
            raise GpuBackendError(f"NVML failed while {what} ({error}).{hint}") from error
        finally:
            nvml.nvmlShutdown()

    def discover(self) -> list[Gpu]:
        hint = (" Check `nvidia-smi -q` on the node: a GPU that fell off the bus or needs a reset shows there;"
                " the agent publishes once NVML reads cleanly.")
        with self._session("reading the GPUs", hint) as nvml:
            driver = _text(nvml.nvmlSystemGetDriverVersion())
            cuda = int(nvml.nvmlSystemGetCudaDriverVersion())
            # As NVIDIA's DRA driver formats it (nvlib.go): 13000 -> 13.0.
            cuda_version = f"{cuda // 1000}.{cuda % 1000 // 10}"
            gpus, links = [], {}
            for index in range(nvml.nvmlDeviceGetCount()):
                gpu = self._gpu(index, driver, cuda_version)
                links[gpu.pci_bus_id] = self._nvlinks(nvml.nvmlDeviceGetHandleByIndex(index), gpu.uuid)
                gpus.append(gpu)
            domains = nvlink_domains(links)
            return [replace(g, nvlink_domain=domains.get(g.pci_bus_id)) for g in gpus]

    def _gpu(self, index: int, driver: str, cuda: str) -> Gpu:
        nvml = self.nvml
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        major, minor_cc = nvml.nvmlDeviceGetCudaComputeCapability(handle)
        mig_capable, mig_enabled = False, False
        try:
            current, _pending = nvml.nvmlDeviceGetMigMode(handle)
            mig_capable, mig_enabled = True, current == nvml.NVML_DEVICE_MIG_ENABLE
        except nvml.NVMLError_NotSupported:
            pass
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        name = _text(nvml.nvmlDeviceGetName(handle))
        memory = self._memory(handle, index, uuid, name)
        raw_bus_id = _text(nvml.nvmlDeviceGetPciInfo(handle).busId)
        try:
            bus_id = normalized_bus_id(raw_bus_id)
        except PciAddressError as error:
            raise GpuBackendError(f"GPU {index} ({uuid}): {error}; NVML answered something this agent cannot"
                                  " publish as resource.kubernetes.io/pciBusID.") from error
        return Gpu(
            index=index,
            uuid=uuid,
            product_name=name,
            memory=memory,
            pci_bus_id=bus_id,
            architecture=ARCHITECTURES.get(int(nvml.nvmlDeviceGetArchitecture(handle)), "Unknown"),
            compute_capability=f"{major}.{minor_cc}",
            driver_version=driver,
            minor=int(nvml.nvmlDeviceGetMinorNumber(handle)),
            mig_capable=mig_capable,
            mig_enabled=mig_enabled,
            mig_profiles=self._mig_profiles(handle, uuid, memory) if mig_capable and memory else (),
            brand=BRANDS.get(int(nvml.nvmlDeviceGetBrand(handle)), "Unknown"),
            cuda_driver_version=cuda,
            pcie_root=self._pcie_root(bus_id),
            numa_node=self._numa_node(handle, bus_id),
        )

    def _memory(self, handle: Any, index: int, uuid: str, name: str) -> int:
        """NVML's memory total; where NVML does not support the query (NVIDIA's DRA driver goes on
        without it, ``nvlib.go``), the catalog's figure for the model, else 0 (no policy fits it)."""
        nvml = self.nvml
        try:
            return int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
        except nvml.NVMLError_NotSupported:
            model = catalog_model(name)
            log.warning("NVML does not report this GPU's memory; the catalog's figure is taken where it knows the"
                        " model, else none (no device of any policy fits it, no MIG profile is named)", gpu=uuid,
                        index=index, product=name, catalog_memory=model.memory if model else None)
            return model.memory if model else 0

    def _pcie_root(self, bus_id: str) -> str | None:
        """As deviceattribute.GetPCIeRootAttributeByPCIBusID: None (no attribute) where sysfs
        cannot say (a VM without the PCI hierarchy, sysfs not mounted)."""
        try:
            return pcie_root(bus_id, os.readlink(self.sysfs / "bus" / "pci" / "devices" / bus_id))
        except (OSError, PciAddressError) as error:
            log.info("no PCIe root for a GPU (its resource.kubernetes.io/pcieRoot attribute is left out)",
                     pci_bus_id=bus_id, error=str(error))
            return None

    def _numa_node(self, handle: Any, bus_id: str) -> int | None:
        """The NUMA node of the GPU's PCI function, as ``resource.kubernetes.io/numaNode`` means it: the
        kernel's ``numa_node`` in sysfs (deviceattribute.GetNUMANodeAttributeByPCIBusID reads the same,
        as does NVIDIA's driver); where sysfs cannot say, NVML's memory affinity when it names exactly one
        node. None (no attribute) for a device with no NUMA affinity (-1) or where neither says.
        ``nvmlDeviceGetNumaNodeId`` is not asked: it answers only where the GPU's own memory is a NUMA
        node (a Grace Hopper), and then names that node, not the CPUs' next to it."""
        try:
            node = int((self.sysfs / "bus" / "pci" / "devices" / bus_id / "numa_node").read_text().strip())
            return node if node >= 0 else None
        except (OSError, ValueError):
            pass
        nvml = self.nvml
        words = 4  # 64-bit words: up to 256 NUMA nodes
        try:
            mask = nvml.nvmlDeviceGetMemoryAffinity(handle, words, nvml.NVML_AFFINITY_SCOPE_NODE)
        except nvml.NVMLError as error:
            log.info("no NUMA node for a GPU (its resource.kubernetes.io/numaNode attribute is left out)",
                     pci_bus_id=bus_id, error=str(error))
            return None
        nodes = [64 * word + bit for word in range(words) for bit in range(64) if int(mask[word]) >> bit & 1]
        return nodes[0] if len(nodes) == 1 else None

    def _nvlinks(self, handle: Any, uuid: str) -> tuple[NvLink, ...] | None:
        """The GPU's active NVLinks and what is at the far end of each (another GPU, an NVSwitch), read
        link by link until NVML says the GPU has no more (a GPU without NVLink: none). None where an
        active link cannot be described: its domain is then not known, and it gets none."""
        nvml = self.nvml
        kinds: dict[int, LinkKind] = {int(nvml.NVML_NVLINK_DEVICE_TYPE_GPU): "gpu",
                                      int(nvml.NVML_NVLINK_DEVICE_TYPE_SWITCH): "switch"}
        found = []
        for link in range(int(nvml.NVML_NVLINK_MAX_LINKS)):
            try:
                active = nvml.nvmlDeviceGetNvLinkState(handle, link) == nvml.NVML_FEATURE_ENABLED
            except (nvml.NVMLError_NotSupported, nvml.NVMLError_InvalidArgument):
                break  # no NVLink at all, or past the GPU's last link
            except nvml.NVMLError as error:
                log.info("NVML cannot say whether a GPU's NVLink is up: no NVLink domain for it", gpu=uuid, link=link,
                         error=str(error))
                return None
            if not active:
                continue
            try:
                remote = normalized_bus_id(_text(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId))
            except (nvml.NVMLError, PciAddressError) as error:
                log.info("NVML cannot say what a GPU's NVLink reaches: no NVLink domain for it", gpu=uuid, link=link,
                         error=str(error))
                return None
            try:
                kind = int(nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link))
            except nvml.NVMLError:
                kind = -1  # an older driver: the far end is told by its bus id (inventory.topology)
            if kind == int(nvml.NVML_NVLINK_DEVICE_TYPE_IBMNPU):
                continue  # a CPU's NVLink (POWER9): no GPU is reached through it
            found.append(NvLink(remote, kinds.get(kind, "unknown")))
        return tuple(found)

    def _mig_profiles(self, handle: Any, uuid: str, memory: int) -> tuple[MigProfile, ...]:
        """The GPU's MIG profiles whatever its MIG mode: NVML's v1 profile query answers on any
        MIG-capable GPU, its versioned one (pynvml's default) only in MIG mode (nvml.h:
        NOT_SUPPORTED "if device doesn't have MIG mode enabled"), so v1 as go-nvlib's
        ``VisitMigProfiles`` and NVIDIA's DRA driver query it, named as go-nvlib names them (v1
        carries no name). The placements NVML gives regardless of MIG mode (nvml.h)."""
        nvml = self.nvml
        known = {value: shape for name, shape in GI_PROFILES.items()
                 if (value := getattr(nvml, f"NVML_GPU_INSTANCE_PROFILE_{name}", None)) is not None}
        profiles: list[MigProfile] = []
        for profile in range(nvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile, version=1)
            except (nvml.NVMLError_NotSupported, nvml.NVMLError_InvalidArgument):
                continue
            if not info.instanceCount:
                continue
            if profile not in known:
                log.warning("a MIG profile this agent cannot name is left out", gpu=uuid, nvml_profile=profile)
                continue
            placements = (nvml.c_nvmlGpuInstancePlacement_t * MAX_PLACEMENTS)()
            count = ctypes.c_uint(MAX_PLACEMENTS)
            try:
                nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, info.id, placements, ctypes.byref(count))
            except (nvml.NVMLError_NotSupported, nvml.NVMLError_InvalidArgument):
                continue  # a profile NVML cannot place is left out, as NVIDIA's DRA driver does (nvlib.go)
            except nvml.NVMLError_NoPermission:
                # "Requires privileged user" (nvml.h): no profile of the GPU can be placed, so none is kept.
                why = (f"GPU {uuid}: NVML refused the MIG placement query (NO_PERMISSION: it needs root), so its MIG"
                       " profiles are left out and no MIG device is published on it; run as root")
                log.warning("NVML refused the MIG placement query: no MIG profile of the GPU is kept (run as root)",
                            gpu=uuid)
                self.refused.append(why)
                return ()
            found = [(placements[i].start, placements[i].size) for i in range(count.value)]
            slices, suffix = known[profile]
            name = f"{slices}g.{mig_memory_gb(memory, int(info.memorySizeMB))}gb{suffix}"
            if any(p.name == name for p in profiles):
                # go-nvlib's rule can name two profiles alike when a 1g profile holds more than an eighth
                # of the memory (go-nvml's B200: 23552 of 184320 MiB is 1g.45gb, as its double-memory 1g):
                # a device name must say one thing, so the first by NVML's enum keeps it.
                log.warning("two MIG profiles have one name by go-nvlib's rule; the later is left out", gpu=uuid,
                            profile=name, nvml_profile=profile)
                self.refused.append(f"GPU {uuid}: MIG profiles {self._profile_ids[(uuid, name)]} and {profile} are both"
                                    f" named {name} by go-nvlib's rule; {profile} is left out")
                continue
            self._profile_ids[(uuid, name)] = profile
            profiles.append(MigProfile(
                name=name,
                memory=int(info.memorySizeMB) * 1024**2,
                max_count=int(info.instanceCount),
                size=found[0][1] if found else 0,
                starts=tuple(start for start, _ in found),
                media="+me" in name,
                engines=Engines(int(info.multiprocessorCount), int(info.copyEngineCount), int(info.decoderCount),
                                int(info.encoderCount), int(info.jpegCount), int(info.ofaCount)),
            ))
        return tuple(profiles)

    def versioned_profile_names(self, gpu: Gpu) -> dict[str, str | None]:
        """For the read-only check: what NVML's versioned profile query names each of the GPU's
        profiles (None where it answers NOT_SUPPORTED, as nvml.h says it does without MIG mode), to
        set go-nvlib's names against NVML's own."""
        found: dict[str, str | None] = {}
        with self._session(f"reading the MIG profiles of GPU {gpu.index}") as nvml:
            handle = nvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
            for (uuid, name), enum in sorted(self._profile_ids.items()):
                if uuid != gpu.uuid:
                    continue
                try:
                    found[name] = _text(nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, enum, version=2).name)
                except nvml.NVMLError_NotSupported:
                    found[name] = None
        return found

    # MIG

    def mig_enabled(self, gpu: Gpu) -> bool:
        with self._session(f"reading MIG mode of GPU {gpu.index}") as nvml:
            current, _ = nvml.nvmlDeviceGetMigMode(nvml.nvmlDeviceGetHandleByUUID(gpu.uuid))
            return bool(current == nvml.NVML_DEVICE_MIG_ENABLE)

    def set_mig_mode(self, gpu: Gpu, enabled: bool) -> None:
        if not switches_mig_mode(gpu):
            # NVML would only set a pending mode, which takes effect at the next reset (planning.node.mig_mode).
            raise GpuBackendError(
                f"GPU {gpu.index} ({gpu.uuid}, {gpu.architecture}) switches MIG mode only at a GPU reset, which"
                f" gpuslice does not do: switch it with nvidia-smi -i {gpu.index} -mig {int(enabled)}, then reset"
                " the GPU with its clients stopped, or reboot.")
        with self._session(f"switching MIG mode of GPU {gpu.index} ({gpu.uuid})") as nvml:
            handle = nvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
            mode = nvml.NVML_DEVICE_MIG_ENABLE if enabled else nvml.NVML_DEVICE_MIG_DISABLE
            nvml.nvmlDeviceSetMigMode(handle, mode)
            current, pending = nvml.nvmlDeviceGetMigMode(handle)
            if current != mode:
                raise GpuBackendError(
                    f"GPU {gpu.index} ({gpu.uuid}) will switch MIG mode only after a GPU reset (pending mode"
                    f" {pending}); stop its processes and run `nvidia-smi -r -i {gpu.index}`.")
            # NVML's profile information holds for one MIG mode (nvml.h): read it again for this one.
            self._mig_profiles(handle, gpu.uuid, gpu.memory)

    def _profile_enum(self, gpu: Gpu, profile: str) -> int:
        found = self._profile_ids.get((gpu.uuid, profile))
        if found is None:
            raise GpuBackendError(f"GPU {gpu.index} ({gpu.uuid}) has no MIG profile {profile}.")
        return found

    def mig_instances(self, gpu: Gpu) -> list[MigInstance]:
        found: list[MigInstance] = []
        with self._session(f"listing MIG instances of GPU {gpu.index}") as nvml:
            handle = nvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
            current, _ = nvml.nvmlDeviceGetMigMode(handle)
            if current != nvml.NVML_DEVICE_MIG_ENABLE:
                return []
            uuids = self._mig_uuids(handle)
            for (uuid, name), enum in self._profile_ids.items():
                if uuid != gpu.uuid:
                    continue
                info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, enum, version=1)
                instances = (nvml.c_nvmlGpuInstance_t * MAX_INSTANCES)()
                count = ctypes.c_uint(MAX_INSTANCES)
                nvml.nvmlDeviceGetGpuInstances(handle, info.id, instances, ctypes.byref(count))
                for i in range(count.value):
                    gi_info = nvml.nvmlGpuInstanceGetInfo(instances[i])
                    ci = self._first_compute_instance(instances[i])
                    found.append(MigInstance(
                        gpu_uuid=gpu.uuid, profile=name, start=int(gi_info.placement.start),
                        size=int(gi_info.placement.size), gi=int(gi_info.id), ci=ci,
                        uuid=uuids.get((int(gi_info.id), ci), "")))
        return sorted(found, key=lambda m: m.start)

    def _first_compute_instance(self, gpu_instance: Any) -> int:
        nvml = self.nvml
        for slices in sorted(COMPUTE_PROFILES, reverse=True):
            if (profile := getattr(nvml, COMPUTE_PROFILES[slices], None)) is None:
                continue
            try:
                info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gpu_instance, profile, nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
            except (nvml.NVMLError_NotSupported, nvml.NVMLError_InvalidArgument):
                continue
            instances = (nvml.c_nvmlComputeInstance_t * MAX_INSTANCES)()
            count = ctypes.c_uint(MAX_INSTANCES)
            nvml.nvmlGpuInstanceGetComputeInstances(gpu_instance, info.id, instances, ctypes.byref(count))
            if count.value:
                return int(nvml.nvmlComputeInstanceGetInfo(instances[0]).id)
        return -1  # a GPU instance without a compute instance (made by hand, or half made)

    def _mig_uuids(self, handle: Any) -> dict[tuple[int, int], str]:
        nvml = self.nvml
        found = {}
        for index in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
            except nvml.NVMLError_NotFound:
                continue
            key = (int(nvml.nvmlDeviceGetGpuInstanceId(mig)), int(nvml.nvmlDeviceGetComputeInstanceId(mig)))
            found[key] = _text(nvml.nvmlDeviceGetUUID(mig))
        return found

    def create_mig(self, gpu: Gpu, profile: MigProfile, start: int) -> MigInstance:
        enum = self._profile_enum(gpu, profile.name)
        ci_profile = getattr(self.nvml, COMPUTE_PROFILES.get(profile.compute_slices, ""), None)
        if ci_profile is None:
            raise GpuBackendError(f"MIG profile {profile.name} has no compute instance profile of its size"
                                  f" ({profile.compute_slices} slices) in this NVML binding.")
        with self._session(f"creating a {profile.name} instance at memory slice {start} of GPU {gpu.index}"
                           f" ({gpu.uuid})") as nvml:
            handle = nvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, enum, version=1)
            placement = nvml.c_nvmlGpuInstancePlacement_t()
            placement.start, placement.size = start, profile.size
            # NVML takes a pointer, and pynvml passes the argument on as is: by value, the
            # structure's bytes would be read as an address.
            gpu_instance = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, info.id, ctypes.byref(placement))
            try:
                ci_info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gpu_instance, ci_profile, nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
                compute = nvml.nvmlGpuInstanceCreateComputeInstance(gpu_instance, ci_info.id)
            except nvml.NVMLError:
                nvml.nvmlGpuInstanceDestroy(gpu_instance)  # no half instance is left behind
                raise
            gi = int(nvml.nvmlGpuInstanceGetInfo(gpu_instance).id)
            ci = int(nvml.nvmlComputeInstanceGetInfo(compute).id)
            uuid = self._mig_uuids(handle).get((gi, ci), "")
        return MigInstance(gpu_uuid=gpu.uuid, profile=profile.name, start=start, size=profile.size, gi=gi, ci=ci,
                           uuid=uuid)

    def destroy_mig(self, gpu: Gpu, instance: MigInstance) -> None:
        with self._session(f"destroying the {instance.profile} instance (GPU instance {instance.gi}) of GPU"
                           f" {gpu.index} ({gpu.uuid})") as nvml:
            handle = nvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
            try:
                gpu_instance = nvml.nvmlDeviceGetGpuInstanceById(handle, instance.gi)
            except nvml.NVMLError_NotFound:
                return  # already gone
            if instance.ci >= 0:
                with contextlib.suppress(nvml.NVMLError_NotFound):
                    compute = nvml.nvmlGpuInstanceGetComputeInstanceById(gpu_instance, instance.ci)
                    nvml.nvmlComputeInstanceDestroy(compute)
            nvml.nvmlGpuInstanceDestroy(gpu_instance)

    # Health

    def faults(self) -> dict[str, Fault]:
        self._watch_events()
        with self._events_lock:
            found, self._events = self._events, {}
        nvml = self.nvml
        try:
            with self._session("probing the GPUs"):
                for index in range(nvml.nvmlDeviceGetCount()):
                    handle = nvml.nvmlDeviceGetHandleByIndex(index)
                    uuid = _text(nvml.nvmlDeviceGetUUID(handle))
                    try:
                        nvml.nvmlDeviceGetMemoryInfo(handle)
                    except nvml.NVMLError as error:
                        if getattr(error, "value", None) == nvml.NVML_ERROR_GPU_IS_LOST:
                            found[uuid] = Fault("lost", None, f"NVML: {error}")
        except GpuBackendError as error:
            log.warning("could not probe the GPUs' health", error=str(error))
        return found

    def _watch_events(self) -> None:
        if self._watcher is None or not self._watcher.is_alive():
            self._watcher = threading.Thread(target=self._event_loop, name="nvml-events", daemon=True)
            self._watcher.start()

    def _event_loop(self) -> None:
        nvml = self.nvml
        try:
            nvml.nvmlInit()
            events = nvml.nvmlEventSetCreate()
            uuids = {}
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuids[index] = _text(nvml.nvmlDeviceGetUUID(handle))
                try:
                    nvml.nvmlDeviceRegisterEvents(
                        handle, nvml.nvmlEventTypeXidCriticalError | nvml.nvmlEventTypeDoubleBitEccError, events)
                except nvml.NVMLError_NotSupported:
                    log.warning("GPU does not report XID/ECC events; only GPU-lost is watched", gpu=uuids[index])
            while True:
                try:
                    event = nvml.nvmlEventSetWait(events, 5000)
                except nvml.NVMLError_Timeout:
                    continue
                fault = self._fault_of(event)
                if fault is not None:
                    uuid = _text(nvml.nvmlDeviceGetUUID(event.device))
                    with self._events_lock:
                        self._events[uuid] = fault
        except nvml.NVMLError as error:
            log.error("NVML event watch stopped; XID and ECC events are not seen until the agent restarts",
                      error=str(error))

    def _fault_of(self, event: Any) -> Fault | None:
        nvml = self.nvml
        if event.eventType & nvml.nvmlEventTypeDoubleBitEccError:
            return Fault("ecc", None, "double-bit ECC error")
        if event.eventType & nvml.nvmlEventTypeXidCriticalError:
            xid = int(event.eventData)
            if xid in IGNORED_XIDS:
                return None
            return Fault("lost" if xid in LOST_XIDS else "xid", xid, f"XID {xid}")
        return None

    # What a container needs

    def host(self, gpus: list[Gpu]) -> HostFacts:
        return host_facts([g.pci_bus_id for g in gpus], [g.minor for g in gpus], self.dev, self.proc, self.sysfs)

    def access(self, grant: Grant, gpu: Gpu, instance: MigInstance | None) -> Access:
        """The claim's own CDI edits for the device, by the NVIDIA Container Toolkit's rules
        (``dra.nvidia_cdi``), and the toolkit spec's common edits."""
        toolkit, host = load_toolkit(self.cdi_dirs, gpu.driver_version), self.host([gpu])
        ref = GpuRef(gpu.uuid, gpu.index, gpu.minor, gpu.pci_bus_id)
        try:
            common = common_edits(toolkit, host)
            if instance is None:
                found = whole_gpu_edits(toolkit, ref, host)
            else:
                found = mig_edits(toolkit, ref, MigRef(instance.profile, instance.gi, instance.ci), host)
        except NvidiaCdiError as error:
            raise GpuBackendError(str(error)) from error
        return Access(found.edits, common)

    def container_problems(self) -> list[str]:
        """No toolkit spec with the driver's libraries, or only specs of another driver (a spec left
        from before a driver upgrade: its libraries are gone)."""
        try:
            with self._session("reading the driver's version") as nvml:
                driver = _text(nvml.nvmlSystemGetDriverVersion())
        except GpuBackendError as error:
            return [str(error)]
        toolkit = load_toolkit(self.cdi_dirs, driver)
        try:
            toolkit.common()
        except NvidiaCdiError as error:
            return [str(error)]
        for spec in toolkit.stale():
            log.warning("a CDI spec of another driver is left on the node; gpuslice does not use it (generate it"
                        " again, or remove it)", spec=spec.path, spec_driver=spec.driver_version, driver=driver)
        return []

    # What runs on a GPU

    def processes(self, gpu: Gpu) -> list[GpuProcess]:
        """NVML's compute processes of the GPU, or in MIG mode of each of its MIG devices, MPS
        clients included (NVML lists them apart: ``nvmlDeviceGetMPSComputeRunningProcesses``), with
        each one's device memory; and the SM share of each from the process utilisation samples
        since the last call (``nvmlDeviceGetProcessUtilization``; not every GPU or MIG device keeps
        them). In MIG mode the parent's handle is never asked: nvml.h says it then answers the
        aggregate of its MIG devices (to a privileged caller), which added to theirs counts each
        process twice."""
        with self._session(f"reading the processes of GPU {gpu.index}") as nvml:
            handle = nvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
            handles = self._mig_handles(handle) if gpu.mig_enabled else [handle]
            used: dict[int, int] = {}
            for device in handles:
                seen: dict[int, int] = {}
                for listing in PROCESS_LISTS:
                    for process in self._listed(device, *listing):
                        memory = int(process.usedGpuMemory or 0)
                        seen[int(process.pid)] = max(seen.get(int(process.pid), 0), memory)
                for pid, memory in seen.items():  # a client listed twice on one device counts once
                    used[pid] = used.get(pid, 0) + memory
            busy = self._sm_shares(handle, gpu.uuid)
        return [GpuProcess(pid, gpu.uuid, memory, busy.get(pid)) for pid, memory in sorted(used.items())]

    def _listed(self, device: Any, name: str, older: str) -> list[Any]:
        """One of NVML's process lists of a device: the ``_v3`` call, which drivers before R510 lack
        (FunctionNotFound), so the ``_v2`` one there; none where the device keeps none (NotSupported,
        NotFound). Any other error is the GPU's, raised."""
        nvml = self.nvml
        try:
            try:
                return list(getattr(nvml, name)(device))
            except nvml.NVMLError_FunctionNotFound:
                return list(getattr(nvml, older)(device))
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_NotFound):
            return []

    def _mig_handles(self, handle: Any) -> list[Any]:
        nvml, found = self.nvml, []
        for index in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                found.append(nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index))
            except nvml.NVMLError_NotFound:
                continue
        return found

    def _sm_shares(self, handle: Any, uuid: str) -> dict[int, float]:
        nvml = self.nvml
        try:
            samples = nvml.nvmlDeviceGetProcessUtilization(handle, self._utilization_seen.get(uuid, 0))
        except nvml.NVMLError:  # no sample since the last call, or not kept on this GPU
            return {}
        shares: dict[int, float] = {}
        for sample in samples:
            shares[int(sample.pid)] = max(shares.get(int(sample.pid), 0.0), min(int(sample.smUtil), 100) / 100)
            self._utilization_seen[uuid] = max(self._utilization_seen.get(uuid, 0), int(sample.timeStamp))
        return shares

    # MPS

    def mps_control(self) -> Path | None:
        """``nvidia-cuda-mps-control``: on PATH (the NVIDIA Container Toolkit mounts the driver's
        binaries, this one among them, into the agent's container: ``pkg/nvcdi/driver-nvml.go``,
        ``newDriverBinariesDiscoverer``), else in the driver root's bin directories."""
        found = shutil.which(MPS_CONTROL)
        if found is not None:
            return Path(found)
        for directory in MPS_SEARCH:
            candidate = self.driver_root / directory / MPS_CONTROL
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return candidate
        return None

    def mps_commands(self, shm: Path) -> tuple[list[str], list[str]]:
        control = self.mps_control()
        if control is None:
            places = ", ".join(str(self.driver_root / d) for d in MPS_SEARCH)
            raise GpuBackendError(
                f"{MPS_CONTROL} is not on PATH nor in {places}: the NVIDIA driver's MPS binaries are missing from"
                " the agent's container. Run the agent with the nvidia runtime class (the nvidia overlay), or set"
                " --nvidia-driver-root to where the host's driver is mounted.")
        launch = [sys.executable, "-m", "gpuslice.agent.mps.launch", str(shm)]
        return [*launch, str(control), "-f", *self.mps_args], [str(control)]
