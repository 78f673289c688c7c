"""Kubernetes Events on a policy, for what a human must see (kubectl describe gsp)."""

from __future__ import annotations

import datetime

import structlog

from gpuslice.api.policy import GROUP, KIND, VERSION
from gpuslice.dra.names import short_hash
from gpuslice.kube.client import KubeClient, KubeError

# Events about cluster-scoped objects live in the default namespace, as kubectl expects.
EVENT_NAMESPACE = "default"
# The same event again within this window is the same transition seen twice (a timer that ran on a
# body our own status patch had not yet reached), not news: it is dropped rather than counted.
REPEAT_WINDOW = datetime.timedelta(seconds=30)
_TIME = "%Y-%m-%dT%H:%M:%SZ"
log = structlog.get_logger(__name__)


async def post_event(kube: KubeClient, policy: str, uid: str, kind: str, reason: str, message: str) -> None:
    """Post an Event, or count a repeat on the existing one, as the kubelet's event correlator does.

    The name is derived from what the event says, so a repeat finds its earlier self.
    """
    now = datetime.datetime.now(datetime.UTC)
    stamp = now.strftime(_TIME)
    events = f"/api/v1/namespaces/{EVENT_NAMESPACE}/events"
    name = f"{policy}.{short_hash(uid, kind, reason, message)}"
    body = {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": name, "namespace": EVENT_NAMESPACE},
        "involvedObject": {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": policy, "uid": uid},
        "reason": reason, "message": message[:1024], "type": kind,
        "source": {"component": "gpuslice-controller"},
        "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
    }
    try:
        try:
            await kube.create(events, body)
        except KubeError as error:
            if error.status != 409:
                raise
            earlier = await kube.get(f"{events}/{name}")
            last = datetime.datetime.strptime(earlier.get("lastTimestamp") or stamp, _TIME).replace(tzinfo=datetime.UTC)
            if now - last < REPEAT_WINDOW:
                return
            await kube.merge_patch(f"{events}/{name}", {"count": int(earlier.get("count") or 1) + 1,
                                                        "lastTimestamp": stamp})
    except KubeError as error:  # an event is worth a log line, never a failed reconcile
        log.warning("could not post event", policy=policy, reason=reason, error=error.message)
