"""The fake GPUs' mutable state, kept in the agent's state directory so it outlives the agent.

What a real GPU keeps across a restart of the agent (MIG mode, the MIG instances that
exist) is kept here, and so is what tests and the demo make happen to a GPU on cue
(faults, failing operations): ``gpuslice fake-gpu`` edits this file while the agent
runs, and the agent reads it on every call. Both sides read-modify-write it under
one lock. GPUs are named by index, as on the fake node's command line.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Literal, TypeVar

import pydantic

from gpuslice.agent.files import locked, write_atomic

STATE_FILE = "fake-gpus.json"
LOCK_FILE = "fake-gpus.lock"
Operation = Literal["create-mig", "destroy-mig", "set-mig-mode", "processes"]
OPERATIONS: tuple[Operation, ...] = ("create-mig", "destroy-mig", "set-mig-mode", "processes")
T = TypeVar("T")


class FakeMigInstance(pydantic.BaseModel):
    gi: int
    ci: int
    profile: str
    start: int
    size: int
    uuid: str


class FakeGpu(pydantic.BaseModel):
    mig_enabled: bool  # NVML's current MIG mode
    instances: list[FakeMigInstance] = []
    # Before Hopper a MIG mode set is pending until the GPU is reset (NVML's pending mode): set on every
    # discovery from the model, as a GPU's architecture is.
    switches_at_reset: bool = False
    pending: bool | None = None  # the MIG mode nvidia-smi set that a reset makes current


class FakeFault(pydantic.BaseModel):
    kind: Literal["xid", "ecc", "lost"]
    code: int | None = None
    message: str = ""


class FakeProcess(pydantic.BaseModel):
    """A process using a fake GPU, as NVML would list it (``gpuslice fake-gpu use``): its pid in the
    node's PID namespace, which the agent maps to a pod through ``/proc/<pid>/cgroup``."""

    gpu: int
    pid: int
    memory: int  # bytes
    sm: float = 0.0  # share of the SMs it keeps busy, 0..1


class InjectedFailure(pydantic.BaseModel):
    """The next ``remaining`` calls of ``operation`` (on ``gpu``, or any GPU) fail; -1: all of them."""

    operation: Operation
    gpu: int | None = None
    remaining: int = 1


class FakeState(pydantic.BaseModel):
    version: Literal[1] = 1
    gpus: dict[int, FakeGpu] = {}
    faults: dict[int, FakeFault] = {}
    failures: list[InjectedFailure] = []
    processes: list[FakeProcess] = []
    serial: int = 0  # MIG instances made so far: their UUIDs differ each time, as real ones do

    def take_failure(self, operation: Operation, gpu: int) -> InjectedFailure | None:
        """The injected failure that applies to this call, counted down; None if the call may succeed."""
        for failure in self.failures:
            if failure.operation == operation and failure.gpu in (None, gpu) and failure.remaining != 0:
                if failure.remaining > 0:
                    failure.remaining -= 1
                self.failures = [f for f in self.failures if f.remaining != 0]
                return failure
        return None


class FakeStateFile:
    """The state of one fake node's GPUs; in memory only when there is no directory (``gpuslice plan``)."""

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory
        self._memory = FakeState()

    @property
    def path(self) -> Path | None:
        return self.directory / STATE_FILE if self.directory else None

    def read(self) -> FakeState:
        if self.directory is None:
            return self._memory.model_copy(deep=True)
        with locked(self.directory / LOCK_FILE):
            return self._load()

    def update(self, change: Callable[[FakeState], T]) -> T:
        """Apply ``change`` to the state and save it (also when ``change`` raises: a failure it
        consumed stays consumed)."""
        if self.directory is None:
            return change(self._memory)
        with locked(self.directory / LOCK_FILE):
            state = self._load()
            try:
                return change(state)
            finally:
                write_atomic(self.directory / STATE_FILE, state.model_dump_json(indent=2))

    def _load(self) -> FakeState:
        assert self.directory is not None
        try:
            text = (self.directory / STATE_FILE).read_text()
        except FileNotFoundError:
            return FakeState()
        try:
            return FakeState.model_validate(json.loads(text))
        except (ValueError, pydantic.ValidationError) as error:
            raise ValueError(f"{self.directory / STATE_FILE} is not a fake GPU state file ({error}); remove it to"
                             " start the fake GPUs afresh") from None


def set_mig_mode(state: FakeState, gpu: int, enabled: bool) -> str:
    """What an admin's ``nvidia-smi -i GPU -mig 1|0`` does, and what it says: the mode is current at once
    on Hopper and later; before Hopper it is pending until the GPU is reset (``reset``), as NVML's
    pending mode. Refused while the GPU has MIG instances (NVML: in use) when switching off. A GPU the
    agent has not seen yet starts so."""
    found = state.gpus.setdefault(gpu, FakeGpu(mig_enabled=enabled))
    if found.instances and not enabled:
        raise ValueError(f"GPU {gpu} has {len(found.instances)} MIG instances; destroy them before turning MIG mode"
                         " off.")
    if found.switches_at_reset and found.mig_enabled != enabled:
        found.pending = enabled
        return (f"GPU {gpu}: MIG mode {'on' if enabled else 'off'} is pending until the GPU is reset (gpuslice fake-gpu"
                f" reset {gpu}, as nvidia-smi -r -i {gpu}).")
    found.mig_enabled, found.pending = enabled, None
    return f"GPU {gpu}: MIG mode {'on' if enabled else 'off'}."


def reset(state: FakeState, gpu: int) -> str:
    """What ``nvidia-smi -r -i GPU`` does: refused while a process uses the GPU; a pending MIG mode
    becomes current, and its MIG instances do not survive it."""
    found = state.gpus.get(gpu)
    if found is None:
        raise ValueError(f"GPU {gpu} is not known to the fake backend yet (its agent has not discovered it).")
    users = sorted(p.pid for p in state.processes if p.gpu == gpu)
    if users:
        raise ValueError(f"GPU {gpu} cannot be reset: processes {', '.join(map(str, users))} use it.")
    if found.pending is not None:
        found.mig_enabled, found.pending = found.pending, None
    found.instances = []
    return f"GPU {gpu} reset: MIG mode {'on' if found.mig_enabled else 'off'}."


def admin_sets_mig_mode(state: FakeState, gpu: int, enabled: bool) -> None:
    """An admin's ``nvidia-smi -i GPU -mig 1|0`` and, where it is pending, the GPU's reset."""
    set_mig_mode(state, gpu, enabled)
    if state.gpus[gpu].pending is not None:
        reset(state, gpu)
