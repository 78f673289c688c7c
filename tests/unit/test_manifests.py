"""manifests/base/static.yaml is manifests/*.yaml as `make manifests` renders it now."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_static_manifests_are_fresh() -> None:
    checked = subprocess.run([sys.executable, str(REPO / "hack/manifests.py"), "--check"],
                             capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stderr


def test_every_manifest_file_is_in_the_kustomize_base() -> None:
    static = (REPO / "manifests/base/static.yaml").read_text()
    for path in sorted((REPO / "manifests").glob("*.yaml")):
        assert f"# manifests/{path.name}\n" in static, f"manifests/{path.name} is not in the base: run `make manifests`"
