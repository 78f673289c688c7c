"""The tools hack/kind/build.py builds alone with Go and caches (kustomize, helm, the Prometheus
Operator's CRDs), for the tests that need them: `make test-unit` and `make test-cluster` build
kustomize first, so a missing tool costs a build here, never a skip."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def hack_tool(target: str) -> str:
    """The path of ``target`` (`build.py TARGET` prints it), built and cached if it is not yet."""
    done = subprocess.run([sys.executable, str(REPO / "hack/kind/build.py"), target], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, f"building {target} failed:\n{done.stderr}"
    return done.stdout.strip()
