"""The node's CDI directory, as far as gpuslice's own spec files go (one per prepared claim).

Files are replaced atomically: a runtime (or the pod runner) reading the directory
while prepare writes sees the old spec or the new, and the temporary file's name
ends in ``.tmp``, which CDI never loads. Only ``gpuslice.dev-gpu_*.json`` files are
ever touched; other drivers' specs are left alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpuslice.agent.files import remove_durably, write_atomic
from gpuslice.dra.cdi import claim_uid_of, spec_file_name


class CdiDirectory:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)

    def path(self, claim_uid: str) -> Path:
        return self.directory / spec_file_name(claim_uid)

    def write(self, claim_uid: str, spec: dict[str, Any]) -> str:
        """Write the claim's spec; its file name."""
        path = self.path(claim_uid)
        write_atomic(path, json.dumps(spec, indent=2, sort_keys=True) + "\n")
        return path.name

    def remove(self, claim_uid: str) -> bool:
        return remove_durably(self.path(claim_uid))

    def claims(self) -> set[str]:
        """UIDs of the claims that have a spec of ours here."""
        found = set()
        for path in self.directory.iterdir():
            if (uid := claim_uid_of(path.name)) is not None:
                found.add(uid)
        return found
