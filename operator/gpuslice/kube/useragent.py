"""The User-Agent of gpuslice's requests, formed as client-go forms its own
(``kubectl/v1.37.2 (linux/amd64) kubernetes/abc1234``), so that the API server's audit log
tells the controller, the agent and a person's CLI apart.

One process is one component, as client-go takes it from the binary's name: the command that
starts the process names it (``gpuslice controller`` sets ``gpuslice-controller``).
"""

from __future__ import annotations

import platform
import sys

from gpuslice import __version__

# Go's GOARCH names, which every other client in an audit log uses.
ARCHITECTURES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64", "ppc64le": "ppc64le",
                 "s390x": "s390x"}
_component = "gpuslice"


def set_component(name: str) -> None:
    """``gpuslice-controller``, ``gpuslice-agent`` or ``gpuslice-cli``: who this process is."""
    global _component
    _component = name


def component() -> str:
    return _component


def user_agent(product: str | None = None, name: str | None = None) -> str:
    """``gpuslice-cli/0.1.0 (linux/amd64)``; ``product`` is added after, as client-go adds
    ``kubernetes/<commit>`` (Kopf's session adds ``kopf/<version>``)."""
    machine = platform.machine().lower()
    system = {"win32": "windows"}.get(sys.platform, sys.platform)
    agent = f"{name or _component}/{__version__} ({system}/{ARCHITECTURES.get(machine, machine)})"
    return f"{agent} {product}" if product else agent
