"""Kubernetes Events on a policy, for what a human must see (kubectl describe gsp)."""

from __future__ import annotations

import datetime

import structlog

from gpuslice.api.policy import GROUP, KIND, VERSION
from gpuslice.coordinates import event_path, events_in
from gpuslice.dra.names import short_hash
from gpuslice.kube.client import Conflict, KubeClient, KubeError

# Events about cluster-scoped objects live in the default namespace, as kubectl expects.
EVENT_NAMESPACE = "default"
# The same event again within this window is the same transition seen twice (a timer that ran on a
# body our own status patch had not yet reached), not news: it is dropped rather than counted.
REPEAT_WINDOW = datetime.timedelta(seconds=30)
_TIME = "%Y-%m-%dT%H:%M:%SZ"
log = structlog.get_logger(__name__)


async def post_event(kube: KubeClient, policy: str, uid: str, kind: str, reason: str, message: str) -> None:
    """An Event on a policy (in ``default``, where ``kubectl describe gsp`` finds it)."""
    await post_object_event(kube, EVENT_NAMESPACE, {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": policy,
                                                    "uid": uid}, kind, reason, message)


async def post_object_event(kube: KubeClient, namespace: str, involved: dict[str, str], kind: str, reason: str,
                            message: str) -> None:
    """Post an Event about ``involved`` (an object reference; a namespaced object's in its own
    namespace) in ``namespace``, or count a repeat on the existing one, as the
    kubelet's event correlator does. The name is derived from what the event says, so a repeat
    finds its earlier self."""
    now = datetime.datetime.now(datetime.UTC)
    stamp = now.strftime(_TIME)
    name = f"{involved['name'][:200]}.{short_hash(involved.get('uid', ''), kind, reason, message)}"
    body = {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": name, "namespace": namespace},
        "involvedObject": involved,
        "reason": reason, "message": message[:1024], "type": kind,
        "source": {"component": "gpuslice-controller"},
        "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
    }
    try:
        try:
            await kube.create(events_in(namespace), body)
        except Conflict:
            earlier = await kube.get(event_path(namespace, name))
            last = datetime.datetime.strptime(earlier.get("lastTimestamp") or stamp, _TIME).replace(tzinfo=datetime.UTC)
            if now - last < REPEAT_WINDOW:
                return
            await kube.merge_patch(event_path(namespace, name), {"count": int(earlier.get("count") or 1) + 1,
                                                                 "lastTimestamp": stamp})
    except KubeError as error:  # an event is worth a log line, never a failed reconcile
        log.warning("could not post event", involved=involved.get("name"), reason=reason, error=error.message)
