"""Events on policies, posted with the controller's own RBAC: a repeat is counted, not re-posted."""

from __future__ import annotations

import datetime
from pathlib import Path

from gpuslice.controller.events import EVENT_NAMESPACE, post_event
from gpuslice.kube.client import KubeClient

EVENTS = f"/api/v1/namespaces/{EVENT_NAMESPACE}/events"


async def test_same_transition_twice_is_one_event_and_a_later_repeat_is_counted(
    kube: KubeClient, controller_kubeconfig: Path, unique: str,
) -> None:
    policy, uid = f"events-{unique}", f"uid-{unique}"

    async def ours() -> list[dict[str, object]]:
        return [e for e in await kube.list(EVENTS) if e["involvedObject"]["name"] == policy]

    async with await KubeClient.from_kubeconfig(controller_kubeconfig) as as_controller:
        # A status timer that ran on a body our own status patch had not reached yet says it again.
        for _ in range(2):
            await post_event(as_controller, policy, uid, "Warning", "SliceLargerThanGpu", "too big")
        [event] = await ours()
        assert (event["reason"], event["count"], event["source"]) == (
            "SliceLargerThanGpu", 1, {"component": "gpuslice-controller"})

        # The same problem coming back later is counted on the same Event, as kubectl shows "x2".
        earlier = (datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
        await kube.merge_patch(f"{EVENTS}/{event['metadata']['name']}", {"lastTimestamp": earlier})
        await post_event(as_controller, policy, uid, "Warning", "SliceLargerThanGpu", "too big")
        [counted] = await ours()
        assert counted["count"] == 2
        assert counted["lastTimestamp"] > earlier

        # Another message is another Event.
        await post_event(as_controller, policy, uid, "Warning", "SliceLargerThanGpu", "still too big")
        assert sorted(e["message"] for e in await ours()) == ["still too big", "too big"]
