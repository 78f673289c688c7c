"""A fake NVIDIA node's driver root for gpuslice's mock ``libnvidia-ml.so.1`` (``hack/nvidia/mocknvml``).

The library answers NVML's C ABI over go-nvml's DGX mocks; this module gives it what it reads (the
node's config, from gpuslice's catalog: memory as NVML reports it, each MIG profile's figures and
placements) and lays out the rest of a driver's root the way NVIDIA's tools look for it: the
libraries under ``usr/lib/x86_64-linux-gnu`` named by the driver's version, real character device
nodes (nvidia-ctk skips a node that is not one), ``proc/devices`` and
``proc/driver/nvidia-caps/mig-minors``. The mock's state file (MIG mode and instances, processes,
faults) is shared by every process that loads the library, under ``state.lock``; ``MockState`` is
its shape, which ``gpuslice fake-gpu`` edits on an NVML node as it edits the fake backend's.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

import pydantic

from gpuslice.devcluster.errors import DevClusterError
from gpuslice.devcluster.nvidia_build import MPS_CONTROL, MPS_SERVER, container_toolkit, mock_nvml_library, mps_binaries
from gpuslice.inventory.catalog import MODELS, MigProfile
from gpuslice.planning.node.mig_mode import BEFORE_HOPPER

LIB_DIR = "usr/lib/x86_64-linux-gnu"
CONFIG_DIR = "gpuslice-mock-nvml"
# go-nvml's DGX mock and GPU for each model a mock node can have; a model the catalog lacks (B200)
# keeps go-nvml's figures.
MOCK_MODELS: dict[str, tuple[str, str]] = {
    "a100-40gb": ("dgxa100", "a100-sxm4-40gb"),
    "a100-80gb": ("dgxa100", "a100-sxm4-80gb"),
    "h100-80gb": ("dgxh100", "h100-sxm5-80gb"),
    "h200-141gb": ("dgxh200", "h200-sxm5-141gb"),
    "b200-180gb": ("dgxb200", "b200-sxm5-180gb"),
}
# go-nvml's DGX mocks' driver (dgx*.go), which names the root's libraries.
MOCK_DRIVERS = {"dgxa100": "550.54.15", "dgxh100": "550.54.15", "dgxh200": "550.54.15", "dgxb200": "560.28.03"}
# NVML's GPU instance profile enums (nvml.h) of the seven-slice family.
ENUM_1_SLICE, ENUM_2_SLICE, ENUM_3_SLICE, ENUM_4_SLICE, ENUM_7_SLICE = 0, 1, 2, 3, 4
ENUM_1_SLICE_REV1, ENUM_1_SLICE_REV2 = 7, 9
# The kernel's numbers for the nodes (nvidia's is fixed; nvidia-uvm's and nvidia-caps' are
# dynamic, these are what a DGX commonly shows).
MAJORS = {"nvidia": 195, "nvidia-uvm": 510, "nvidia-caps": 511}
CONTROL_MINORS = {"nvidiactl": 255, "nvidia-modeset": 254}
GIS, CIS = 15, 8  # GPU instances per GPU and compute instances per GPU instance in mig-minors
XID_EVENT, ECC_EVENT = 0x8, 0x2  # nvmlEventTypeXidCriticalError, nvmlEventTypeDoubleBitEccError
MAX_EVENTS = 64
T = TypeVar("T")


@contextlib.contextmanager
def locked(lock_file: Path) -> Iterator[None]:
    """The library's own lock (state.go flocks the same file)."""
    with open(lock_file, "a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def write_atomic(path: Path, text: str) -> None:
    """Replaced by rename, as the library writes it: its readers take no lock."""
    descriptor, temporary = tempfile.mkstemp(prefix=".state-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(descriptor, "w") as handle:
            handle.write(text)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def profile_enum(profile: MigProfile) -> int:
    """NVML's enum for a catalog profile of the seven-slice family."""
    slices = profile.compute_slices
    if profile.media:
        return ENUM_1_SLICE_REV1
    if slices == 1:
        return ENUM_1_SLICE_REV2 if profile.size == 2 else ENUM_1_SLICE
    return {2: ENUM_2_SLICE, 3: ENUM_3_SLICE, 4: ENUM_4_SLICE, 7: ENUM_7_SLICE}[slices]


def gpu_config(model: str, mig: bool) -> dict[str, object]:
    """One GPU of the config: go-nvml's GPU, and the catalog's figures where it has the model."""
    if model not in MOCK_MODELS:
        raise DevClusterError(f"no go-nvml mock for GPU model {model!r}: the mock NVML node knows"
                              f" {', '.join(MOCK_MODELS)}.")
    found: dict[str, object] = {"mock": MOCK_MODELS[model][1], "migMode": mig}
    catalogued = MODELS.get(model)
    if catalogued is None:
        return found
    found.update(name=catalogued.product_name, memoryMiB=catalogued.memory // 2**20)
    profiles = []
    for profile in catalogued.mig_profiles:
        engines = profile.engines
        profiles.append({
            "enum": profile_enum(profile), "memoryMiB": profile.memory // 2**20, "instanceCount": profile.max_count,
            "multiprocessors": engines.multiprocessors if engines else 0,
            "copyEngines": engines.copy_engines if engines else 0, "decoders": engines.decoders if engines else 0,
            "encoders": engines.encoders if engines else 0, "jpegEngines": engines.jpeg_engines if engines else 0,
            "ofaEngines": engines.ofa_engines if engines else 0, "starts": list(profile.starts), "size": profile.size,
        })
    found["profiles"] = profiles
    return found


def node_config(node: str, model: str, count: int, mig: bool = False) -> dict[str, object]:
    """The library's config for a node of ``count`` GPUs of ``model`` (MIG mode as it first starts)."""
    server = MOCK_MODELS[model][0] if model in MOCK_MODELS else ""
    return {"server": server, "node": node, "gpus": [gpu_config(model, mig) for _ in range(count)]}


# The state file (state.go's State).


class MockComputeInstance(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(populate_by_name=True)
    id: int
    profile_id: int = pydantic.Field(alias="profileId")
    start: int
    size: int
    uuid: str


class MockGpuInstance(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(populate_by_name=True)
    id: int
    profile_id: int = pydantic.Field(alias="profileId")
    start: int
    size: int
    compute_instances: list[MockComputeInstance] = pydantic.Field(default=[], alias="computeInstances")


class MockProcess(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(populate_by_name=True)
    pid: int
    memory: int
    mps: bool = False
    sm: float = 0.0
    mig_uuid: str = pydantic.Field(default="", alias="migUuid")


class MockEvent(pydantic.BaseModel):
    seq: int
    type: int
    data: int


class MockGpu(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(populate_by_name=True)
    mig_mode: int = pydantic.Field(default=0, alias="migMode")
    pending_mig_mode: int = pydantic.Field(default=0, alias="pendingMigMode")
    lost: bool = False
    instances: list[MockGpuInstance] = []
    processes: list[MockProcess] = []
    events: list[MockEvent] = []

    @pydantic.field_validator("instances", "processes", "events", mode="before")
    @classmethod
    def _null_is_empty(cls, value: object) -> object:
        return [] if value is None else value


class MockFailure(pydantic.BaseModel):
    call: str
    gpu: int | None = None
    return_: int = pydantic.Field(alias="return")
    remaining: int = 1
    model_config = pydantic.ConfigDict(populate_by_name=True)


class MockState(pydantic.BaseModel):
    version: Literal[1] = 1
    serial: int = 0
    seq: int = 0
    gpus: dict[str, MockGpu] = {}
    failures: list[MockFailure] = []

    @pydantic.field_validator("failures", "gpus", mode="before")
    @classmethod
    def _null_is_empty(cls, value: object, info: pydantic.ValidationInfo) -> object:
        if value is None:
            return {} if info.field_name == "gpus" else []
        return value

    def gpu(self, config: dict[str, object], index: int) -> MockGpu:
        """The GPU's state, as the library first makes it (its MIG mode from the config)."""
        gpus = config.get("gpus")
        if not isinstance(gpus, list) or not 0 <= index < len(gpus):
            raise ValueError(f"the node has no GPU {index}")
        if str(index) not in self.gpus:
            mig = int(bool(gpus[index].get("migMode")) and bool(gpus[index].get("profiles", True)))
            self.gpus[str(index)] = MockGpu.model_validate({"migMode": mig, "pendingMigMode": mig})
        return self.gpus[str(index)]

    def post(self, config: dict[str, object], index: int, kind: int, data: int) -> None:
        """An XID or ECC event, seen by every event set made before it."""
        self.seq += 1
        gpu = self.gpu(config, index)
        gpu.events = [*gpu.events, MockEvent(seq=self.seq, type=kind, data=data)][-MAX_EVENTS:]


class MockStateFile:
    """The mock's state file of one node (``<lib dir>/gpuslice-mock-nvml``), edited under its lock."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    @property
    def config(self) -> dict[str, object]:
        loaded = json.loads((self.directory / "config.json").read_text())
        assert isinstance(loaded, dict)
        return loaded

    def read(self) -> MockState:
        with locked(self.directory / "state.lock"):
            return self._load()

    def update(self, change: Callable[[MockState], T]) -> T:
        with locked(self.directory / "state.lock"):
            state = self._load()
            result = change(state)
            write_atomic(self.directory / "state.json", state.model_dump_json(by_alias=True, indent=2))
            return result

    def _load(self) -> MockState:
        try:
            text = (self.directory / "state.json").read_text()
        except FileNotFoundError:
            return MockState()
        return MockState.model_validate(json.loads(text))


# The driver root.


def mig_minors(gpus: int) -> list[tuple[str, int]]:
    """``/proc/driver/nvidia-caps/mig-minors`` as the driver lists it: config, monitor, then per GPU
    each GPU instance's access and each of its compute instances'."""
    lines, minor = [("config", 1), ("monitor", 2)], 3
    for gpu in range(gpus):
        for gi in range(GIS):
            lines.append((f"gpu{gpu}/gi{gi}/access", minor))
            minor += 1
            for ci in range(CIS):
                lines.append((f"gpu{gpu}/gi{gi}/ci{ci}/access", minor))
                minor += 1
    return lines


def _mknod(path: Path, major: int, minor: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    try:
        os.mknod(path, 0o666 | 0o020000, os.makedev(major, minor))  # S_IFCHR
    except PermissionError as error:
        raise DevClusterError(
            f"could not make the character device {path} ({error}): a mock NVML node needs root (CAP_MKNOD),"
            " as NVIDIA's tools accept only real device nodes. Run as root, or use the fake backend.") from error
    os.chmod(path, 0o666)


def _place(library: Path, target: Path) -> None:
    """The library in the root: a hard link where the cache is on the same filesystem, else a copy
    (never a symlink: nvidia-ctk would follow it out of the root)."""
    with contextlib.suppress(FileNotFoundError):
        target.unlink()
    try:
        os.link(library, target)
    except OSError:
        shutil.copy2(library, target)


def make_driver_root(root: Path, config: dict[str, object], library: Path, host_proc: Path | None = None) -> Path:
    """Lay out a fake driver root for ``config`` (``node_config``) with ``library``; the library's
    config directory (its state file lives there). ``host_proc``: the node's /proc, which gets the
    kernel's files (devices, nvidia-caps/mig-minors) too, as the root's own proc does."""
    server = str(config["server"])
    driver = str(config.get("driverVersion") or MOCK_DRIVERS[server])
    gpus = config["gpus"]
    assert isinstance(gpus, list)
    libs = root / LIB_DIR
    libs.mkdir(parents=True, exist_ok=True)
    _place(library, libs / f"libnvidia-ml.so.{driver}")
    for name, target in (("libnvidia-ml.so.1", f"libnvidia-ml.so.{driver}"), ("libcuda.so.1", f"libcuda.so.{driver}")):
        with contextlib.suppress(FileNotFoundError):
            (libs / name).unlink()
        (libs / name).symlink_to(target)
    (libs / f"libcuda.so.{driver}").touch()  # nvcdi looks for the driver's libraries by their version
    directory = libs / CONFIG_DIR
    directory.mkdir(exist_ok=True)
    write_atomic(directory / "config.json", json.dumps(config, indent=2))
    dev = root / "dev"
    (dev / "nvidia-caps").mkdir(parents=True, exist_ok=True)
    for index in range(len(gpus)):
        _mknod(dev / f"nvidia{index}", MAJORS["nvidia"], index)
    for name, minor in CONTROL_MINORS.items():
        _mknod(dev / name, MAJORS["nvidia"], minor)
    _mknod(dev / "nvidia-uvm", MAJORS["nvidia-uvm"], 0)
    _mknod(dev / "nvidia-uvm-tools", MAJORS["nvidia-uvm"], 1)
    minors = mig_minors(len(gpus))
    for _, minor in minors:
        _mknod(dev / "nvidia-caps" / f"nvidia-cap{minor}", MAJORS["nvidia-caps"], minor)
    for proc in (root / "proc", *((host_proc,) if host_proc else ())):
        (proc / "driver/nvidia-caps").mkdir(parents=True, exist_ok=True)
        (proc / "driver/nvidia-caps/mig-minors").write_text("".join(f"{name} {minor}\n" for name, minor in minors))
        _capability_files(proc / "driver/nvidia/capabilities", minors)
        (proc / "devices").write_text(
            "Character devices:\n  1 mem\n  4 tty\n"
            + "".join(f"{major} {name}\n" for name, major in sorted(MAJORS.items(), key=lambda item: item[1]))
            + "\nBlock devices:\n  8 sd\n")
    return directory


def _capability_files(directory: Path, minors: list[tuple[str, int]]) -> None:
    """The driver's MIG capability files (``/proc/driver/nvidia/capabilities/gpu<N>/mig/gi<G>/access``,
    ``.../ci<C>/access``, ``mig/config``, ``mig/monitor``), which NVIDIA's device plugin reads a MIG
    device's capability minors from (go-nvlib's nvcaps)."""
    for name, minor in minors:
        if name in ("config", "monitor"):
            path = directory / "mig" / name
        else:
            gpu, rest = name.split("/", 1)
            path = directory / gpu / "mig" / rest
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n")


def generate_spec(root: Path, output: Path, *args: str, toolkit: Path | None = None) -> str:
    """NVIDIA's ``nvidia-ctk cdi generate`` over the root (its libraries, device nodes and the mock
    library, which nvcdi loads); its log. nvml mode reads the host's
    ``/proc/driver/nvidia-caps/mig-minors`` whatever the driver root (``dgpu.go``: ``NewMigCaps``), so
    it runs in a mount namespace of its own where the root's ``proc/driver`` is the host's."""
    toolkit = toolkit or container_toolkit()
    output.parent.mkdir(parents=True, exist_ok=True)
    command = [str(toolkit / "nvidia-ctk"), "cdi", "generate", f"--driver-root={root}",
               f"--nvidia-cdi-hook-path={toolkit / 'nvidia-cdi-hook'}", f"--output={output}", *args]
    unshare = shutil.which("unshare")
    if unshare and os.geteuid() == 0 and Path("/proc/driver").is_dir():
        command = [unshare, "--mount", "--propagation", "private", "sh", "-ec",
                   'mount --bind "$0" /proc/driver; exec "$@"', str(root / "proc/driver"), *command]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not output.exists():
        raise DevClusterError(f"nvidia-ctk cdi generate failed for the mock node at {root}.",
                              log_tail=done.stderr[-3000:])
    return done.stderr


@dataclass(frozen=True)
class NvmlNode:
    """A fake node's NVIDIA driver root (the mock library) and the toolkit's spec of it."""

    root: Path
    cdi: Path

    @property
    def state(self) -> MockStateFile:
        return state_file(self.root)

    def agent_args(self) -> list[str]:
        return ["--backend=nvml", f"--nvidia-driver-root={self.root}", f"--nvidia-cdi-dir={self.cdi}"]


MANAGEMENT = ("--mode=management", "--vendor=management.nvidia.com")  # as the GPU Operator's toolkit writes it
STATE_LINK = "mock-nvml"  # in the agent's state directory: where `gpuslice fake-gpu` finds the mock's state


def prepare_node(node_dir: Path, node: str, model: str, count: int, mig: bool | None = None,
                 spec_args: Sequence[str] = ()) -> NvmlNode:
    """A dev cluster node's NVIDIA side: the driver root in ``node_dir/nvidia`` with NVIDIA's MPS
    binaries (Debian's), its kernel files in the node's /proc (``node_dir/proc``, the agent's
    --host-proc), and the NVIDIA Container Toolkit's spec, generated by nvidia-ctk, in
    ``node_dir/nvidia-cdi``. MIG mode starts as the fake backend
    starts it unless ``mig`` says: on before Hopper, off from Hopper on.

    nvml mode cannot write a spec for a node whose GPUs are all in MIG mode with no MIG instance (its
    ``all`` device has no edits: "invalid device, empty device edits"; with ``--no-all-device``,
    "invalid spec, no devices"), so such a node gets the GPU Operator's management spec."""
    if mig is None:
        mig = model in MODELS and MODELS[model].architecture == "Ampere"
    root, cdi = node_dir / "nvidia", node_dir / "nvidia-cdi"
    directory = make_driver_root(root, node_config(node, model, count, mig), mock_nvml_library(), node_dir / "proc")
    mps = mps_binaries()
    (root / "usr/bin").mkdir(parents=True, exist_ok=True)
    for binary in (MPS_CONTROL, MPS_SERVER):  # where a driver installs them both (nvcdi looks there)
        _place(mps / binary, root / "usr/bin" / Path(binary).name)
    if not spec_args and mig:
        spec_args = MANAGEMENT
    generate_spec(root, cdi / "nvidia.yaml", *spec_args)
    (node_dir / "agent").mkdir(parents=True, exist_ok=True)
    link = node_dir / "agent" / STATE_LINK
    with contextlib.suppress(FileNotFoundError):
        link.unlink()
    link.symlink_to(directory)
    return NvmlNode(root, cdi)


def state_file(root: Path) -> MockStateFile:
    return MockStateFile(root / LIB_DIR / CONFIG_DIR)


@contextlib.contextmanager
def environment(root: Path) -> Iterator[None]:
    """GPUSLICE_MOCK_NVML_CONFIG naming ``root``'s config for the duration (for a process that loads
    the library by another path)."""
    before = os.environ.get("GPUSLICE_MOCK_NVML_CONFIG")
    os.environ["GPUSLICE_MOCK_NVML_CONFIG"] = str(root / LIB_DIR / CONFIG_DIR / "config.json")
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("GPUSLICE_MOCK_NVML_CONFIG", None)
        else:
            os.environ["GPUSLICE_MOCK_NVML_CONFIG"] = before


# What `gpuslice fake-gpu` does to a node of the mock library, as it does to the fake backend's GPUs.

# The NVML call each of fake-gpu's operations fails in (its next calls answer NVML_ERROR_UNKNOWN).
FAILING_CALLS = {"create-mig": "nvmlDeviceCreateGpuInstanceWithPlacement", "destroy-mig": "nvmlGpuInstanceDestroy",
                 "set-mig-mode": "nvmlDeviceSetMigMode", "processes": "nvmlDeviceGetComputeRunningProcesses_v3"}
NVML_ERROR_UNKNOWN = 999
# NVML's GPU instance profile id for each enum of the seven-slice family (fidelity.go).
PROFILE_IDS = {ENUM_1_SLICE: 19, ENUM_1_SLICE_REV1: 20, ENUM_1_SLICE_REV2: 15, ENUM_2_SLICE: 14, ENUM_3_SLICE: 9,
               ENUM_4_SLICE: 5, ENUM_7_SLICE: 0}


def raise_fault(state: MockState, config: dict[str, object], gpu: int, kind: str, code: int | None) -> None:
    """An XID (79: off the bus, and lost from then on) or double-bit ECC event, or the GPU lost."""
    if kind == "lost" or code == 79:
        state.gpu(config, gpu).lost = True
    if kind == "ecc":
        state.post(config, gpu, ECC_EVENT, 0)
    elif code is not None:
        state.post(config, gpu, XID_EVENT, code)


def clear_fault(state: MockState, config: dict[str, object], gpu: int) -> None:
    """The GPU back (events are seen once: nothing to clear of them)."""
    state.gpu(config, gpu).lost = False


def inject_failure(state: MockState, operation: str, gpu: int | None, times: int) -> None:
    state.failures.append(MockFailure.model_validate(
        {"call": FAILING_CALLS[operation], "gpu": gpu, "return": NVML_ERROR_UNKNOWN, "remaining": times}))


def use(state: MockState, config: dict[str, object], gpu: int, pid: int, memory: int, sm: float) -> None:
    """Process ``pid`` on the GPU (in MIG mode, on its first MIG device); memory 0: it stops."""
    found = state.gpu(config, gpu)
    kept = [p for p in found.processes if p.pid != pid]
    if memory > 0:
        kept.append(MockProcess(pid=pid, memory=memory, sm=sm))
    found.processes = kept


def switches_at_reset(config: dict[str, object], gpu: int) -> bool:
    """Whether the GPU's MIG mode waits for a reset (before Hopper), as the library's
    nvmlDeviceSetMigMode has it (exports_mig.go: by go-nvml's architecture of the GPU)."""
    gpus = config.get("gpus")
    mock = gpus[gpu].get("mock") if isinstance(gpus, list) and 0 <= gpu < len(gpus) else None
    models = [name for name, (_, gpu_mock) in MOCK_MODELS.items() if gpu_mock == mock]
    return bool(models) and models[0] in MODELS and MODELS[models[0]].architecture in BEFORE_HOPPER


def set_mig_mode(state: MockState, config: dict[str, object], gpu: int, enabled: bool) -> str:
    """``nvidia-smi -i GPU -mig 1|0``, and what it says: current at once from Hopper on; before Hopper
    pending until the GPU is reset (``reset``), as the library's nvmlDeviceSetMigMode. Refused with
    MIG instances when switching off (NVML: IN_USE); as the fake backend's ``fake_state.set_mig_mode``."""
    found = state.gpu(config, gpu)
    if found.instances and not enabled:
        raise ValueError(f"GPU {gpu} has {len(found.instances)} MIG instances; destroy them before turning MIG mode"
                         " off.")
    found.pending_mig_mode = int(enabled)
    if switches_at_reset(config, gpu) and found.mig_mode != int(enabled):
        return (f"GPU {gpu}: MIG mode {'on' if enabled else 'off'} is pending until the GPU is reset (gpuslice fake-gpu"
                f" reset {gpu}, as nvidia-smi -r -i {gpu}).")
    found.mig_mode = int(enabled)
    return f"GPU {gpu}: MIG mode {'on' if enabled else 'off'}."


def reset(state: MockState, config: dict[str, object], gpu: int) -> str:
    """``nvidia-smi -r -i GPU``: refused while a process uses the GPU; the pending MIG mode becomes
    current, and no MIG instance survives it (as the fake backend's ``fake_state.reset``)."""
    found = state.gpu(config, gpu)
    users = sorted(p.pid for p in found.processes)
    if users:
        raise ValueError(f"GPU {gpu} cannot be reset: processes {', '.join(map(str, users))} use it.")
    found.mig_mode, found.instances = found.pending_mig_mode, []
    return f"GPU {gpu} reset: MIG mode {'on' if found.mig_mode else 'off'}."


def admin_sets_mig_mode(state: MockState, config: dict[str, object], gpu: int, enabled: bool) -> None:
    """An admin's ``nvidia-smi -i GPU -mig 1|0`` and, where it is pending, the GPU's reset."""
    set_mig_mode(state, config, gpu, enabled)
    found = state.gpu(config, gpu)
    if found.mig_mode != found.pending_mig_mode:
        reset(state, config, gpu)


def heal(state: MockState) -> None:
    for found in state.gpus.values():
        found.lost, found.processes = False, []
    state.failures = []


def profile_names(model: str) -> dict[int, str]:
    """NVML's profile id -> the catalog's profile name, for a catalogued model."""
    catalogued = MODELS.get(model)
    return {PROFILE_IDS[profile_enum(p)]: p.name for p in catalogued.mig_profiles} if catalogued else {}
