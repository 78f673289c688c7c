"""What a container on a fake node would have received, as the pod runner recorded it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gpuslice.devcluster.errors import DevClusterError
from gpuslice.devcluster.state import StateDir


@dataclass(frozen=True)
class RecordedContainer:
    pod: str
    container: str
    env: list[str]
    cdi_devices: list[str]
    device_nodes: list[dict[str, Any]]
    mounts: list[dict[str, Any]]


def find_recorded(state: StateDir, pod: str, container: str | None = None) -> RecordedContainer:
    namespace, _, name = pod.partition("/")
    if not name:
        raise DevClusterError(f"{pod!r}: give the pod as NAMESPACE/NAME.")
    matches = sorted((state.root / "nodes").glob(f"*/containers/{namespace}_{name}_*/*.json"))
    if container:
        matches = [m for m in matches if m.stem == container]
    if not matches:
        raise DevClusterError(
            f"No recorded container for pod {pod}{f' container {container}' if container else ''} in {state.root}:"
            " the pod is not running on a fake node with a pod runner (yet)."
        )
    if len(matches) > 1 and container is None:
        names = ", ".join(m.stem for m in matches)
        raise DevClusterError(f"Pod {pod} has several containers ({names}); name one.")
    data = json.loads(matches[0].read_text())
    return RecordedContainer(data["pod"], data["container"], data.get("env") or [], data.get("cdiDevices") or [],
                             data.get("deviceNodes") or [], data.get("mounts") or [])
