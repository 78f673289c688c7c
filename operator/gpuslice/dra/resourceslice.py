"""ResourceSlice manifests for one node's pool."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuslice.dra.names import DRIVER, MANAGED_BY

LABEL_NODE = "gpuslice.dev/node"


def slice_name(node: str, suffix: str) -> str:
    return f"gpuslice-{node}-{suffix}"


def resource_slice(
    node: str, node_uid: str, suffix: str, generation: int, count: int,
    *, shared_counters: list[dict[str, Any]] | None = None, devices: list[dict[str, Any]] | None = None,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A slice of the node's pool, owned by the Node so it goes when the node goes."""
    spec: dict[str, Any] = {
        "driver": DRIVER,
        "nodeName": node,
        "pool": {"name": node, "generation": generation, "resourceSliceCount": count},
    }
    if shared_counters:
        spec["sharedCounters"] = shared_counters
    else:
        spec["devices"] = devices or []
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {
            "name": slice_name(node, suffix),
            "labels": {**MANAGED_BY, LABEL_NODE: node},
            **({"annotations": dict(annotations)} if annotations else {}),
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid,
                                 "controller": True}],
        },
        "spec": spec,
    }
