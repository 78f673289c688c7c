"""Files the node agent keeps on the node: written whole or not at all, and read-modify-written
under a lock when another process (``gpuslice fake-gpu``) writes the same file.

A reader after a crash (SIGKILL, power loss) sees either the old content or the new,
never a torn file: the content goes to a temporary file in the same directory, is
flushed to disk, and replaces the old one by ``rename``, after which the directory
is flushed too.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


def write_atomic(path: Path, data: bytes | str, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` atomically and durably."""
    raw = data.encode() if isinstance(data, str) else data
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(raw)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    sync_directory(path.parent)


def remove_durably(path: Path) -> bool:
    """Remove ``path`` if it exists (and make the removal durable); whether it existed."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    sync_directory(path.parent)
    return True


def sync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


@contextlib.contextmanager
def locked(lock_file: Path) -> Iterator[None]:
    """An exclusive advisory lock on ``lock_file`` (created if missing), across processes."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
