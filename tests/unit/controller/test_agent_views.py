"""The controller writes a policy's agent view when what the agents plan from changes, and not
when the status changes for a bound pod: the agents' watch of the views then hears nothing. A
restarted controller finds the views as its watch holds them and rewrites none; a policy it has
not taken in (no finalizer yet: created and deleted while it was away) gets none."""

from __future__ import annotations

import copy

from gpuslice.api.agent_view import VIEWS, view_path
from gpuslice.controller.agent_views import FINALIZER, sync_view, written_digest
from gpuslice.kube.client import KubeClient
from tests import builders
from tests.fakeapi import FakeApi

TEN = {"mode": "memory", "sliceSize": "10G"}


async def test_a_view_is_written_for_a_verdict_not_for_a_bound_pod(api: FakeApi, kube: KubeClient) -> None:
    policy = builders.policy("p", TEN, generation=1, uid="u-p", node=builders.NODE, tenants=[builders.TENANT])
    written: dict[str, str] = {}
    assert not await sync_view(kube, policy, False, written, {})  # not taken in yet
    assert not await sync_view(kube, policy, True, written, {})  # gone before it was: nothing asked
    assert api.requests == []
    policy["metadata"]["finalizers"] = [FINALIZER]
    assert await sync_view(kube, policy, False, written, {})
    view = api.get(view_path("p"))
    assert view is not None
    assert "valid" not in view["spec"]  # not judged yet: the agents publish nothing of it
    judged = builders.policy("p", TEN, generation=1, uid="u-p", node=builders.NODE, tenants=[builders.TENANT],
                             judged=True)
    judged["metadata"]["finalizers"] = [FINALIZER]
    assert await sync_view(kube, judged, False, written, {})
    assert (api.get(view_path("p")) or {})["spec"]["valid"]["status"] == "True"
    since = len(api.requests)
    for allocated in range(1, 51):  # fifty pods bound, each a status refresh of the policy
        counted = copy.deepcopy(judged)
        counted["status"]["slices"] = {"published": 64, "allocated": allocated}
        counted["status"]["tenants"] = [{"namespace": builders.TENANT, "allocated": allocated}]
        assert not await sync_view(kube, counted, False, written, {})
    assert api.requests[since:] == []
    # Restarted: nothing in memory, the watch holds the view as written.
    watched = {v["metadata"]["name"]: written_digest(v) for v in api.items(VIEWS)}
    assert not await sync_view(kube, judged, False, {}, watched)
    assert api.requests[since:] == []
    assert await sync_view(kube, judged, True, written, watched)
    assert api.get(view_path("p")) is None
    assert written == {}
