"""The install checks' tools: kustomize (the version kubectl v1.37 embeds), built and cached by
hack/kind/build.py with Go only."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def kustomize() -> str:
    """kustomize as `make kustomize` built it (cached)."""
    built = subprocess.run([sys.executable, str(REPO / "hack/kind/build.py"), "kustomize"],
                           capture_output=True, text=True, check=False)
    assert built.returncode == 0, f"building kustomize failed:\n{built.stderr}"
    return built.stdout.strip()
