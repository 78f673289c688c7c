"""A two-phase checkpoint per claim: what prepare is about to do, then what it did.

``started`` is written (atomically) before prepare changes anything on the node: it
names every device and, for dynamic MIG, the instance it is going to make. So a
process killed at any point leaves a record of what may exist. ``completed`` is
written once everything exists and the CDI spec is in place; only then does the
kubelet get the CDI ids. A retried prepare finds ``completed`` and answers from it,
or finds ``started`` and undoes it first; the agent's start-up sweep undoes every
``started`` one and removes what no ``completed`` one backs (``recovery``).

One file per claim (``claims/<uid>.json``), so claims never wait on each other's writes.

The format is versioned, as NVIDIA's DRA driver versions its checkpoint (``checkpointv.go``):
each version is a model that knows how to become the next (``upgrade``), so a file any earlier
agent wrote is read as the latest (``to_latest``). A file of a version newer than this agent (it
was rolled back) is never guessed at: the agent refuses to start, saying so, and leaves it and
everything it backs alone. A file that does not parse at all is set aside, not fatal.

Since version 2 each checkpoint carries the node's boot ID. A checkpoint from an earlier boot
describes what no longer exists (MIG instances and ``/var/run/cdi`` do not survive a reboot):
recovery undoes it rather than answering the kubelet from it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import pydantic
import structlog

from gpuslice.agent.files import remove_durably, write_atomic
from gpuslice.errors import GpusliceError

log = structlog.get_logger(__name__)
Phase = Literal["started", "completed"]


class MigRecord(pydantic.BaseModel):
    """A MIG instance a dynamic-MIG device needs: where it goes, and (once made) what the GPU called it."""

    profile: str
    start: int
    size: int
    gi: int | None = None
    ci: int | None = None
    uuid: str | None = None
    created: bool = False  # made by this claim's prepare (dynamic MIG), so unprepare destroys it


class PreparedDevice(pydantic.BaseModel):
    request: str
    pool: str
    device: str
    mode: str
    gpu_uuid: str
    cdi_ids: list[str] = []
    share_id: str | None = None
    consumed_memory: int | None = None
    admin_access: bool = False
    mig: MigRecord | None = None
    mps: bool = False  # a client of the MPS daemon of its GPU and namespace (isolation MPS): it runs while this is here
    policy: str | None = None  # the device's policy, as published when it was prepared
    allocated: int | None = None  # bytes of GPU memory the claim was allocated: its use is measured against it


class ClaimCheckpointV1(pydantic.BaseModel):
    """Version 1 (gpuslice 0.1.0)."""

    version: Literal[1]
    uid: str
    namespace: str
    name: str
    phase: Phase
    devices: list[PreparedDevice] = []
    cdi_spec: str | None = None

    def upgrade(self) -> ClaimCheckpoint:
        return ClaimCheckpoint(**self.model_dump(exclude={"version"}))  # its boot is unknown


class ClaimCheckpoint(pydantic.BaseModel):
    """The latest version (2): version 1 and the node's boot ID when it was written."""

    version: Literal[2] = 2
    uid: str
    namespace: str
    name: str
    phase: Phase
    devices: list[PreparedDevice] = []
    cdi_spec: str | None = None  # file name in the CDI directory, once written
    boot_id: str | None = None  # None: written by version 1, when boot IDs were not recorded

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


# Every version this agent reads, oldest first; each one's upgrade() gives the next.
VERSIONS: dict[int, type[ClaimCheckpointV1] | type[ClaimCheckpoint]] = {1: ClaimCheckpointV1, 2: ClaimCheckpoint}
LATEST = max(VERSIONS)


class CheckpointTooNew(GpusliceError):
    """A checkpoint written by a newer agent: this one cannot tell what it records."""


def to_latest(data: Any) -> ClaimCheckpoint:
    """A checkpoint of any version this agent knows, as the latest (pydantic.ValidationError or
    ValueError when it is not a checkpoint; CheckpointTooNew when a newer agent wrote it)."""
    if not isinstance(data, Mapping):
        raise ValueError("not a JSON object")
    version = data.get("version")
    if isinstance(version, int) and version > LATEST:
        raise CheckpointTooNew(f"version {version}")
    model = VERSIONS.get(version) if isinstance(version, int) else None
    if model is None:
        raise ValueError(f"no checkpoint version {version!r}")
    checkpoint = model.model_validate(data)
    while not isinstance(checkpoint, ClaimCheckpoint):
        checkpoint = checkpoint.upgrade()
    return checkpoint


def read_boot_id(path: Path = Path("/proc/sys/kernel/random/boot_id")) -> str | None:
    """The kernel's ID of this boot (the same in every container on the node); None if unreadable."""
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


class Checkpoints:
    """The claims' checkpoints in ``<state dir>/claims``, stamped with ``boot_id`` (this boot's)."""

    def __init__(self, state_dir: Path, boot_id: str | None = None) -> None:
        self.directory = state_dir / "claims"
        self.directory.mkdir(parents=True, exist_ok=True)
        self.boot_id = boot_id

    def from_earlier_boot(self, checkpoint: ClaimCheckpoint) -> bool:
        return None not in (checkpoint.boot_id, self.boot_id) and checkpoint.boot_id != self.boot_id

    def _path(self, uid: str) -> Path:
        return self.directory / f"{uid}.json"

    def read(self, uid: str) -> ClaimCheckpoint | None:
        return self._load(self._path(uid))

    def write(self, checkpoint: ClaimCheckpoint) -> None:
        stamped = checkpoint.model_copy(update={"boot_id": self.boot_id})
        write_atomic(self._path(checkpoint.uid), stamped.model_dump_json(indent=2), mode=0o600)

    def remove(self, uid: str) -> None:
        remove_durably(self._path(uid))

    def all(self) -> list[ClaimCheckpoint]:
        found = []
        for path in sorted(self.directory.glob("*.json")):
            if (checkpoint := self._load(path)) is not None:
                found.append(checkpoint)
        return found

    def _load(self, path: Path) -> ClaimCheckpoint | None:
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        try:
            return to_latest(json.loads(text))
        except CheckpointTooNew as error:
            raise CheckpointTooNew(
                f"claim checkpoint {path} is of {error}, written by a newer gpuslice agent than this one (which"
                f" reads versions up to {LATEST}); it is left as it is, with everything it records: roll the agent"
                " forward again, or drain the node of gpuslice claims before rolling back") from None
        except (ValueError, pydantic.ValidationError) as error:
            # Written atomically, so this is another version's file or a damaged disk, not a crash.
            aside = path.with_suffix(".unreadable")
            path.rename(aside)
            log.error("claim checkpoint does not parse; set aside, the claim will be prepared afresh",
                      path=str(path), moved_to=str(aside), error=str(error)[:300])
            return None
