"""Kubernetes Events as gpuslice's processes write them: each one new (``create`` is the only verb
their RBAC grants), in the object's namespace, ``default`` for cluster-scoped objects."""

from __future__ import annotations

import datetime
from typing import Any

from gpuslice.coordinates import events_in
from gpuslice.dra.names import short_hash
from gpuslice.kube.client import AlreadyExists, KubeClient


def pod_ref(namespace: str, name: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": name, "uid": uid}


async def create_event(kube: KubeClient, involved: dict[str, Any], reason: str, message: str, *, kind: str,
                       component: str, instance: str = "", key: tuple[str, ...] | None = None) -> bool:
    """Create one Event; whether it was made. ``key`` names it (the same key, the same Event: one
    made before is not made again, so a process that starts over does not repeat itself); without
    one it is named by what it says and when. Other failures raise ``KubeError``."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    name = f"{involved['name'][:200]}.{short_hash(*(key or (instance, reason, message, now)), length=12)}"
    namespace = involved.get("namespace") or "default"
    body = {
        "apiVersion": "v1", "kind": "Event", "metadata": {"name": name, "namespace": namespace},
        "involvedObject": involved, "reason": reason, "message": message[:1024], "type": kind,
        "source": {"component": component, **({"host": instance} if instance else {})},
        "reportingComponent": component, "reportingInstance": instance or component,
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    }
    try:
        await kube.create(events_in(namespace), body)
    except AlreadyExists:
        return False
    return True
