"""Kubernetes Events on a policy, for what a human must see (kubectl describe gsp)."""

from __future__ import annotations

import datetime

import structlog

from gpuslice.api.policy import GROUP, KIND, VERSION
from gpuslice.dra.names import short_hash
from gpuslice.kube.client import KubeClient, KubeError

# Events about cluster-scoped objects live in the default namespace, as kubectl expects.
EVENT_NAMESPACE = "default"
log = structlog.get_logger(__name__)


async def post_event(kube: KubeClient, policy: str, uid: str, kind: str, reason: str, message: str) -> None:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    body = {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{policy}.{short_hash(uid, reason, message, now)}", "namespace": EVENT_NAMESPACE},
        "involvedObject": {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": policy, "uid": uid},
        "reason": reason, "message": message[:1024], "type": kind,
        "source": {"component": "gpuslice-controller"},
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    }
    try:
        await kube.create(f"/api/v1/namespaces/{EVENT_NAMESPACE}/events", body)
    except KubeError as error:  # an event is worth a log line, never a failed reconcile
        log.warning("could not post event", policy=policy, reason=reason, error=error.message)
