"""Fake GPUs with the figures of real models (catalog), for kind and the dev cluster.

Rich enough for every planner path: memory slicing, shared capacity and MIG
with NVML's real profiles and placement tables. UUIDs are stable per node and
index, so a restarted agent publishes the same devices. MIG mode and MIG
instances behave as on a GPU (an instance takes its memory slices; overlapping
placements are refused) and outlive the agent in its state directory, where
``gpuslice fake-gpu`` can also raise faults and make operations fail
(``fake_state``). A container given a fake device receives only gpuslice's
``GPUSLICE_*`` variables.
"""

from __future__ import annotations

import hashlib
import sys
import uuid
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

from gpuslice.agent.gpus import Access, Fault, GpuBackendError, GpuProcess, MigInstance
from gpuslice.agent.gpus.fake_state import FakeGpu, FakeMigInstance, FakeState, FakeStateFile, Operation
from gpuslice.inventory.catalog import MODELS, MigProfile
from gpuslice.inventory.gpus import Gpu
from gpuslice.inventory.systems import SYSTEMS
from gpuslice.planning.grants import Grant
from gpuslice.planning.node.mig_mode import BEFORE_HOPPER, switches_mig_mode


class FakeGpus(NamedTuple):
    """``number`` GPUs of catalog ``model``; ``mig``: whether a MIG-capable one starts in MIG mode
    (None: as a node is usually found, ``starts_in_mig_mode``); ``system``: the server they are
    (``inventory.systems``), whose layout gives each GPU its bus, NUMA node, PCIe root and NVLinks."""

    model: str
    number: int
    mig: bool | None = None
    system: str | None = None


def starts_in_mig_mode(architecture: str) -> bool:
    """A MIG-capable fake GPU first seen without an option: before Hopper (A100, A30) in MIG mode,
    as an admin who gave the node to MIG left it (only a GPU reset switches it there,
    planning.node.mig_mode); Hopper and later with MIG mode off, as from the factory (the agent switches
    it as a policy needs)."""
    return architecture in BEFORE_HOPPER


def parse_fake_gpus(text: str) -> list[FakeGpus]:
    """``h100-80gb:8``, ``h100-80gb:4,l4:2``, ``a100-40gb:2:mig-off`` (MIG-capable GPUs that start
    with MIG mode off, as a GPU fresh from the factory or the GPU Operator's ``all-disabled``) or
    ``h100-80gb:2:mig-on``; without an option, ``starts_in_mig_mode``. A system (``dgx-h100``, alone:
    it is the whole node) is its GPUs with its layout."""
    parsed = []
    parts = [p for p in (p.strip() for p in text.split(",")) if p]
    for part in parts:
        model, _, rest = part.partition(":")
        count, _, option = rest.partition(":")
        if model in SYSTEMS:
            parsed.append(_system(part, model, count, option, alone=len(parts) == 1))
            continue
        if model not in MODELS:
            raise GpuBackendError(f"--fake-gpus: unknown GPU model {model!r}; known: {', '.join(MODELS)}, or a whole"
                                  f" system: {', '.join(SYSTEMS)}.")
        try:
            number = int(count or "1")
        except ValueError:
            raise GpuBackendError(f"--fake-gpus: {part!r} needs a count, e.g. {model}:8.") from None
        if not 1 <= number <= 16:
            raise GpuBackendError(f"--fake-gpus: {part!r}: count must be 1 to 16.")
        if option not in ("", "mig-off", "mig-on"):
            raise GpuBackendError(f"--fake-gpus: {part!r}: unknown option {option!r}; the options are mig-off and"
                                  f" mig-on ({model}:{number}:mig-off: MIG-capable GPUs start with MIG mode off).")
        parsed.append(FakeGpus(model, number, {"": None, "mig-off": False, "mig-on": True}[option]))
    if not parsed:
        raise GpuBackendError("--fake-gpus is empty; give MODEL:COUNT, e.g. h100-80gb:8.")
    return parsed


def _system(part: str, key: str, count: str, option: str, alone: bool) -> FakeGpus:
    system = SYSTEMS[key]
    if not alone:
        raise GpuBackendError(f"--fake-gpus: {key} is a whole system (node); give it alone, e.g. --fake-gpus {key}.")
    if count and count != str(len(system.gpus)):
        raise GpuBackendError(f"--fake-gpus: {part!r}: {key} has {len(system.gpus)} GPUs; give {key} alone.")
    if option not in ("", "mig-off", "mig-on"):
        raise GpuBackendError(f"--fake-gpus: {part!r}: unknown option {option!r}; the options are mig-off and mig-on.")
    return FakeGpus(system.model, len(system.gpus), {"": None, "mig-off": False, "mig-on": True}[option], key)


FAKE_DRIVER, FAKE_CUDA = "580.95.05", "13.0"  # an R580 driver, and the CUDA version it supports


def fake_uuid(node: str, index: int) -> str:
    seed = hashlib.sha256(f"{node}/{index}".encode()).digest()[:16]
    return f"GPU-{uuid.UUID(bytes=seed)}"


class FakeBackend:
    name = "fake"

    def __init__(self, node: str,
                 gpus: Sequence[FakeGpus | tuple[str, int] | tuple[str, int, bool | None]],
                 state_dir: Path | None = None) -> None:
        self.node = node
        self.gpus = [FakeGpus(*g) for g in gpus]
        self.state = FakeStateFile(state_dir)

    def discover(self) -> list[Gpu]:
        found: list[Gpu] = []
        for model_key, count, mig, system_key in self.gpus:
            model = MODELS[model_key]
            system = SYSTEMS[system_key] if system_key else None
            domains = system.nvlink_domains() if system else {}
            for _ in range(count):
                index = len(found)
                bus = 0x18 + 0x10 * index
                slot = system.gpus[index] if system else None
                found.append(Gpu(
                    index=index,
                    uuid=fake_uuid(self.node, index),
                    product_name=model.product_name,
                    memory=model.memory,
                    pci_bus_id=slot.bus if slot else f"0000:{bus:02x}:00.0",
                    architecture=model.architecture,
                    compute_capability=model.compute_capability,
                    driver_version=FAKE_DRIVER,
                    minor=index,
                    mig_capable=model.mig_capable,
                    mig_enabled=model.mig_capable and (starts_in_mig_mode(model.architecture) if mig is None else mig),
                    mig_profiles=model.mig_profiles,
                    brand=model.brand,
                    cuda_driver_version=FAKE_CUDA,
                    # Without a system: each GPU behind its own root, and where it sits otherwise not known.
                    pcie_root=slot.root if slot else f"pci0000:{bus - 1:02x}",
                    numa_node=slot.numa if slot else None,
                    nvlink_domain=domains.get(slot.bus) if slot else None,
                ))
        # A GPU first seen comes up as its option, or starts_in_mig_mode, says; after that its
        # state file knows better.
        def settle(state: FakeState) -> list[Gpu]:
            for gpu in found:
                state.gpus.setdefault(gpu.index, FakeGpu(mig_enabled=gpu.mig_enabled))
                state.gpus[gpu.index].switches_at_reset = gpu.mig_capable and not switches_mig_mode(gpu)
            return [_with_mig_mode(gpu, state.gpus[gpu.index].mig_enabled) for gpu in found]

        return self.state.update(settle)

    # MIG

    def mig_enabled(self, gpu: Gpu) -> bool:
        return self._gpu_state(self.state.read(), gpu).mig_enabled

    def set_mig_mode(self, gpu: Gpu, enabled: bool) -> None:
        def change(state: FakeState) -> None:
            self._injected(state, "set-mig-mode", gpu)
            fake = self._gpu_state(state, gpu)
            if not gpu.mig_capable:
                raise GpuBackendError(f"GPU {gpu.index} ({gpu.uuid}, {gpu.product_name}) has no MIG mode.")
            if not switches_mig_mode(gpu):
                # As the NVML backend: NVML would only set a pending mode, which a reset makes current.
                raise GpuBackendError(f"GPU {gpu.index} ({gpu.uuid}, {gpu.architecture}) switches MIG mode only at a"
                                      " GPU reset, as a real one (planning.node.mig_mode): gpuslice fake-gpu mig-mode"
                                      f" {gpu.index} on|off, then gpuslice fake-gpu reset {gpu.index}, as an admin.")
            if not enabled and fake.instances:
                raise GpuBackendError(f"GPU {gpu.index} ({gpu.uuid}) still has {len(fake.instances)} MIG instances;"
                                      " destroy them before turning MIG mode off.")
            fake.mig_enabled = enabled

        self.state.update(change)

    def mig_instances(self, gpu: Gpu) -> list[MigInstance]:
        fake = self._gpu_state(self.state.read(), gpu)
        return [_instance(gpu, i) for i in fake.instances] if fake.mig_enabled else []

    def create_mig(self, gpu: Gpu, profile: MigProfile, start: int) -> MigInstance:
        def change(state: FakeState) -> MigInstance:
            self._injected(state, "create-mig", gpu)
            fake = self._gpu_state(state, gpu)
            where = f"GPU {gpu.index} ({gpu.uuid})"
            if not fake.mig_enabled:
                raise GpuBackendError(f"{where} is not in MIG mode; cannot create a {profile.name} instance.")
            if start not in profile.starts:
                raise GpuBackendError(f"{where}: {profile.name} cannot be placed at memory slice {start}"
                                      f" (its placements start at {list(profile.starts)}).")
            cells = set(range(start, start + profile.size))
            for other in fake.instances:
                if cells & set(range(other.start, other.start + other.size)):
                    raise GpuBackendError(f"{where}: memory slices {sorted(cells)} are taken by the {other.profile}"
                                          f" instance at {other.start} (GPU instance {other.gi}).")
                if profile.media and other.profile.endswith("+me"):
                    raise GpuBackendError(f"{where}: the media engines are taken by the {other.profile} instance.")
            used = {i.gi for i in fake.instances}
            gi = next(n for n in range(1, 64) if n not in used)
            state.serial += 1
            made = FakeMigInstance(gi=gi, ci=0, profile=profile.name, start=start, size=profile.size,
                                   uuid=f"MIG-{uuid.uuid5(uuid.NAMESPACE_OID, f'{gpu.uuid}/{gi}/{state.serial}')}")
            fake.instances.append(made)
            return _instance(gpu, made)

        return self.state.update(change)

    def destroy_mig(self, gpu: Gpu, instance: MigInstance) -> None:
        def change(state: FakeState) -> None:
            self._injected(state, "destroy-mig", gpu)
            fake = self._gpu_state(state, gpu)
            fake.instances = [i for i in fake.instances if i.gi != instance.gi]

        self.state.update(change)

    # Health and access

    def faults(self) -> dict[str, Fault]:
        state = self.state.read()
        by_index = {g: fake_uuid(self.node, g) for g in state.faults}
        return {by_index[g]: Fault(f.kind, f.code, f.message) for g, f in state.faults.items()}

    def access(self, grant: Grant, gpu: Gpu, instance: MigInstance | None) -> Access:
        return Access()

    def container_problems(self) -> list[str]:
        return []

    def processes(self, gpu: Gpu) -> list[GpuProcess]:
        """The processes ``gpuslice fake-gpu use`` put on the GPU (``fake-gpu fail processes``: NVML's
        lists fail on it)."""
        state = self.state.read()
        if any(f.operation == "processes" and f.gpu in (None, gpu.index) for f in state.failures):
            self.state.update(lambda s: self._injected(s, "processes", gpu))
        return [GpuProcess(p.pid, gpu.uuid, p.memory, p.sm) for p in state.processes if p.gpu == gpu.index]

    def mps_commands(self, shm: Path) -> tuple[list[str], list[str]]:
        """gpuslice's stand-in for nvidia-cuda-mps-control (``agent.mps.standin``): a fake GPU runs no
        CUDA, so shared memory is not needed."""
        standin = [sys.executable, "-m", "gpuslice.agent.mps.standin"]
        return [*standin, "-f"], standin

    def _gpu_state(self, state: FakeState, gpu: Gpu) -> FakeGpu:
        return state.gpus.setdefault(gpu.index, FakeGpu(mig_enabled=gpu.mig_enabled))

    def _injected(self, state: FakeState, operation: Operation, gpu: Gpu) -> None:
        if state.take_failure(operation, gpu.index) is not None:
            raise GpuBackendError(f"GPU {gpu.index} ({gpu.uuid}): {operation} failed (a failure injected with"
                                  " `gpuslice fake-gpu fail`).")


def _with_mig_mode(gpu: Gpu, enabled: bool) -> Gpu:
    return replace(gpu, mig_enabled=enabled) if gpu.mig_capable else gpu


def _instance(gpu: Gpu, fake: FakeMigInstance) -> MigInstance:
    return MigInstance(gpu_uuid=gpu.uuid, profile=fake.profile, start=fake.start, size=fake.size, gi=fake.gi,
                       ci=fake.ci, uuid=fake.uuid)
