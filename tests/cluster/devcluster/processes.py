"""`gpuslice dev-cluster` as a user runs it, and the processes that hold its state directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def processes_using(state_dir: Path) -> list[str]:
    """Command lines of live processes that mention ``state_dir`` (all our components do)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(state_dir) in cmdline and state != "Z":
            found.append(f"{entry.name}: {cmdline.strip()}")
    return found


def gpuslice(*args: str, env: dict[str, str] | None = None, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuslice", *args],
        capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})},
    )
