"""The docs hold together: the generated pages are what the code generates now."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_generated_pages_are_fresh() -> None:
    checked = subprocess.run([sys.executable, str(REPO / "hack/docs/reference.py"), "--check"],
                             capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stderr
