"""The claim checkpoint's format: every version an earlier agent wrote is read as the latest, a
newer one is refused (never guessed at), and each checkpoint knows the boot it was written in.
What recovery does with them is tested with a real kubelet plugin (tests/cluster/plugin)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuslice.agent.node_state.checkpoint import (
    LATEST,
    Checkpoints,
    CheckpointTooNew,
    ClaimCheckpoint,
    read_boot_id,
    to_latest,
)

V1 = {"version": 1, "uid": "u-1", "namespace": "team-a", "name": "c", "phase": "completed", "cdi_spec": "s.json",
      "devices": [{"request": "gpu", "pool": "n", "device": "gpu-0-mig", "mode": "mig", "gpu_uuid": "GPU-1",
                   "mig": {"profile": "1g.10gb", "start": 0, "size": 1, "gi": 7, "ci": 0, "created": True}}]}


def test_a_version_1_checkpoint_reads_as_the_latest_with_its_boot_unknown() -> None:
    checkpoint = to_latest(V1)
    assert isinstance(checkpoint, ClaimCheckpoint)
    assert checkpoint.version == LATEST == 2
    assert checkpoint.boot_id is None
    assert checkpoint.devices[0].mig is not None
    assert (checkpoint.devices[0].mig.gi, checkpoint.cdi_spec, checkpoint.phase) == (7, "s.json", "completed")


def test_a_checkpoint_of_a_newer_agent_is_refused_and_left_alone(tmp_path: Path) -> None:
    checkpoints = Checkpoints(tmp_path, "boot-1")
    path = tmp_path / "claims" / "u-1.json"
    path.write_text(json.dumps({**V1, "version": LATEST + 1, "something": "new"}))
    with pytest.raises(CheckpointTooNew, match="written by a newer gpuslice agent"):
        checkpoints.all()
    assert path.exists(), "left as it is, with everything it records"


def test_a_file_that_is_no_checkpoint_is_set_aside(tmp_path: Path) -> None:
    checkpoints = Checkpoints(tmp_path, "boot-1")
    for name, text in (("a", "[1, 2]"), ("b", '{"version": "one"}'), ("c", "{not json")):
        (tmp_path / "claims" / f"{name}.json").write_text(text)
    assert checkpoints.all() == []
    assert sorted(p.name for p in (tmp_path / "claims").iterdir()) == ["a.unreadable", "b.unreadable", "c.unreadable"]


def test_each_checkpoint_records_the_boot_it_was_written_in(tmp_path: Path) -> None:
    written = Checkpoints(tmp_path, "boot-1")
    written.write(to_latest(V1))
    assert json.loads((tmp_path / "claims" / "u-1.json").read_text())["boot_id"] == "boot-1"
    [same] = Checkpoints(tmp_path, "boot-1").all()
    assert not Checkpoints(tmp_path, "boot-1").from_earlier_boot(same)
    assert Checkpoints(tmp_path, "boot-2").from_earlier_boot(same)
    # A version 1 checkpoint, or a node whose boot ID cannot be read: nothing is assumed.
    assert not Checkpoints(tmp_path, "boot-2").from_earlier_boot(to_latest(V1))
    assert not Checkpoints(tmp_path, None).from_earlier_boot(same)


def test_the_boot_id_is_the_kernels(tmp_path: Path) -> None:
    assert read_boot_id() is not None  # /proc/sys/kernel/random/boot_id on Linux
    (tmp_path / "boot_id").write_text("1234-abcd\n")
    assert read_boot_id(tmp_path / "boot_id") == "1234-abcd"
    assert read_boot_id(tmp_path / "missing") is None
