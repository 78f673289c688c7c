"""Errors of the dev cluster, each worded for the person who has to act on it."""

from __future__ import annotations

from gpuslice.errors import GpusliceError


class DevClusterError(GpusliceError):
    """A failure the user can fix; the message says what happened and what to do."""

    def __init__(self, message: str, *, log_tail: str | None = None) -> None:
        super().__init__(message)
        self.log_tail = log_tail

    def __str__(self) -> str:
        text = super().__str__()
        if self.log_tail:
            indented = "\n".join(f"  | {line}" for line in self.log_tail.splitlines())
            text = f"{text}\n  last lines of its log:\n{indented}"
        return text
