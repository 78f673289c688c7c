"""A two-phase checkpoint per claim: what prepare is about to do, then what it did.

``started`` is written (atomically) before prepare changes anything on the node: it
names every device and, for dynamic MIG, the instance it is going to make. So a
process killed at any point leaves a record of what may exist. ``completed`` is
written once everything exists and the CDI spec is in place; only then does the
kubelet get the CDI ids. A retried prepare finds ``completed`` and answers from it,
or finds ``started`` and undoes it first; the agent's start-up sweep undoes every
``started`` one and removes what no ``completed`` one backs (``recovery``).

One file per claim (``claims/<uid>.json``), so claims never wait on each other's writes.
The schema is versioned; a file that does not parse is set aside, not fatal.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import pydantic
import structlog

from gpuslice.agent.files import remove_durably, write_atomic

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


class ClaimCheckpoint(pydantic.BaseModel):
    version: Literal[1] = 1
    uid: str
    namespace: str
    name: str
    phase: Phase
    devices: list[PreparedDevice] = []
    cdi_spec: str | None = None  # file name in the CDI directory, once written

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class Checkpoints:
    """The claims' checkpoints in ``<state dir>/claims``."""

    def __init__(self, state_dir: Path) -> None:
        self.directory = state_dir / "claims"
        self.directory.mkdir(parents=True, exist_ok=True)

    def _path(self, uid: str) -> Path:
        return self.directory / f"{uid}.json"

    def read(self, uid: str) -> ClaimCheckpoint | None:
        return self._load(self._path(uid))

    def write(self, checkpoint: ClaimCheckpoint) -> None:
        write_atomic(self._path(checkpoint.uid), checkpoint.model_dump_json(indent=2), mode=0o600)

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
            return ClaimCheckpoint.model_validate(json.loads(text))
        except (ValueError, pydantic.ValidationError) as error:
            # Written atomically, so this is another version's file or a damaged disk, not a crash.
            aside = path.with_suffix(".unreadable")
            path.rename(aside)
            log.error("claim checkpoint does not parse; set aside, the claim will be prepared afresh",
                      path=str(path), moved_to=str(aside), error=str(error)[:300])
            return None
