"""The unit tier's specs by NVIDIA's generator (``tests/unit/dra/nvidia_ctk/``) are what the pinned
nvidia-ctk writes now over the pinned mock NVML library: CI regenerates them and compares."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuslice.devcluster.nvidia_specs import FIXTURE_DIR, check

ROOT = Path(__file__).resolve().parents[3]


def test_the_fixtures_are_what_nvidia_ctk_writes_now() -> None:
    """CI regenerates the specs with the pinned nvidia-ctk and mock library, and compares."""
    if os.geteuid() != 0:
        pytest.fail("regenerating nvidia-ctk's specs needs root (device nodes, a mount namespace): run the unit"
                    " tier as root, as CI does")
    assert check(ROOT / FIXTURE_DIR) == [], "run `python -m gpuslice.devcluster.nvidia_specs` and review the diff"
