"""Kubernetes Events the node agent records, for what a person must see: a GPU that turned unhealthy
(on the Node), a MIG reconfiguration that failed (on the policy), a pod that uses more GPU
memory than it was allocated (on the pod, in its namespace). The agent may create Events
(manifests/agent-rbac.yaml); outside its own slices it writes only those, its claims' device
status and evictions."""

from __future__ import annotations

import datetime
from typing import Any

import structlog

from gpuslice.dra.names import short_hash
from gpuslice.kube.client import KubeClient, KubeError

log = structlog.get_logger(__name__)


def node_ref(node: str) -> dict[str, Any]:
    # A Node's events carry its name as uid, as the kubelet's do.
    return {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node}


def policy_ref(name: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": "gpuslice.dev/v1alpha1", "kind": "GpuSlicePolicy", "name": name, "uid": uid}


def pod_ref(namespace: str, name: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": name, "uid": uid}


async def record_event(kube: KubeClient | None, node: str, involved: dict[str, Any], reason: str, message: str,
                       kind: str = "Warning") -> None:
    """Create one Event (in the object's namespace; ``default`` for cluster-scoped objects); a failure
    is logged."""
    if kube is None:
        return
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    name = f"{involved['name']}.{short_hash(node, reason, message, now, length=12)}"
    namespace = involved.get("namespace") or "default"
    body = {
        "apiVersion": "v1", "kind": "Event", "metadata": {"name": name, "namespace": namespace},
        "involvedObject": involved, "reason": reason, "message": message[:1024], "type": kind,
        "source": {"component": "gpuslice-agent", "host": node},
        "reportingComponent": "gpuslice-agent", "reportingInstance": node,
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    }
    try:
        await kube.create(f"/api/v1/namespaces/{namespace}/events", body)
    except KubeError as error:
        log.warning("could not record an Event", node=node, reason=reason, error=str(error))
