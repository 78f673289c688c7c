"""Kubernetes Events the node agent records, for what a person must see: a GPU that turned unhealthy
or an MPS daemon that died (on the Node), a MIG reconfiguration that failed (on the policy). Both
are cluster-scoped objects, whose Events live in ``default``: the only namespace the agent may
create Events in (manifests/agent-rbac.yaml). Events about pods are the controller's."""

from __future__ import annotations

from typing import Any

import structlog

from gpuslice.kube.client import KubeClient, KubeError
from gpuslice.kube.events import create_event

log = structlog.get_logger(__name__)


def node_ref(node: str) -> dict[str, Any]:
    # A Node's events carry its name as uid, as the kubelet's do.
    return {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node}


def policy_ref(name: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": "gpuslice.dev/v1alpha1", "kind": "GpuSlicePolicy", "name": name, "uid": uid}


async def record_event(kube: KubeClient | None, node: str, involved: dict[str, Any], reason: str, message: str,
                       kind: str = "Warning") -> None:
    """Create one Event in ``default``; a failure is logged."""
    if kube is None:
        return
    try:
        await create_event(kube, involved, reason, message, kind=kind, component="gpuslice-agent", instance=node)
    except KubeError as error:
        log.warning("could not record an Event", node=node, reason=reason, error=str(error))
