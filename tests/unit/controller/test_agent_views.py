"""The controller writes a policy's agent view when what the agents plan from changes, and not
when the status changes for a bound pod: the agents' watch of the views then hears nothing. A
restarted controller finds the views as its watch holds them and rewrites none; a policy it has
not taken in (no finalizer yet: created and deleted while it was away) gets none."""

from __future__ import annotations

import copy

from gpuslice.api.agent_view import VIEWS, view_path
from gpuslice.controller.agent_views import FINALIZER, sync_view, written_digest
from gpuslice.controller.apply import APPLIED
from gpuslice.controller.indexes import view_index, views
from gpuslice.kube.client import KubeClient
from tests import builders
from tests.fakeapi import FakeApi

TEN = {"mode": "memory", "sliceSize": "10G"}


async def test_a_view_is_written_for_a_verdict_not_for_a_bound_pod(api: FakeApi, kube: KubeClient) -> None:
    policy = builders.policy("p", TEN, generation=1, uid="u-p", node=builders.NODE, tenants=[builders.TENANT])
    written: dict[str, tuple[str, float]] = {}
    assert not await sync_view(kube, policy, False, written, {}, 1.0)  # not taken in yet
    assert not await sync_view(kube, policy, True, written, {}, 1.0)  # gone before it was: nothing asked
    assert api.requests == []
    policy["metadata"]["finalizers"] = [FINALIZER]
    assert await sync_view(kube, policy, False, written, {}, 1.0)
    view = api.get(view_path("p"))
    assert view is not None
    assert "valid" not in view["spec"]  # not judged yet: the agents publish nothing of it
    judged = builders.policy("p", TEN, generation=1, uid="u-p", node=builders.NODE, tenants=[builders.TENANT],
                             judged=True)
    judged["metadata"]["finalizers"] = [FINALIZER]
    assert await sync_view(kube, judged, False, written, {}, 1.0)
    assert (api.get(view_path("p")) or {})["spec"]["valid"]["status"] == "True"
    since = len(api.requests)
    for allocated in range(1, 51):  # fifty pods bound, each a status refresh of the policy
        counted = copy.deepcopy(judged)
        counted["status"]["slices"] = {"published": 64, "allocated": allocated}
        counted["status"]["tenants"] = [{"namespace": builders.TENANT, "allocated": allocated}]
        assert not await sync_view(kube, counted, False, written, {}, 1.0)
    assert api.requests[since:] == []
    # Restarted: nothing in memory, the watch holds the view as written.
    watched = {v["metadata"]["name"]: written_digest(v) for v in api.items(VIEWS)}
    assert not await sync_view(kube, judged, False, {}, watched, 1.0)
    assert api.requests[since:] == []
    assert await sync_view(kube, judged, True, written, watched, 1.0)
    assert api.get(view_path("p")) is None
    assert written == {}


async def test_a_view_deleted_or_changed_under_the_controller_is_written_again(api: FakeApi, kube: KubeClient) -> None:
    """The watch judges, not the record of what this process wrote: a view someone deleted (or one
    another leader wrote since) is written again once the process's own write had time to echo."""
    policy = builders.policy("p", TEN, generation=1, uid="u-p", node=builders.NODE, tenants=[builders.TENANT],
                             judged=True)
    policy["metadata"]["finalizers"] = [FINALIZER]
    written: dict[str, tuple[str, float]] = {}
    assert await sync_view(kube, policy, False, written, {}, 1.0)
    digest = written_digest(api.get(view_path("p")) or {})
    assert not await sync_view(kube, policy, False, written, {}, 2.0)  # its own write, not yet echoed
    assert not await sync_view(kube, policy, False, written, {"p": digest}, 60.0)  # echoed
    await kube.delete(view_path("p"))
    assert await sync_view(kube, policy, False, written, {}, 70.0)  # gone from the watch: written again
    assert api.get(view_path("p")) is not None
    assert await sync_view(kube, policy, False, written, {"p": "another leader's"}, 80.0)


async def test_a_deleted_policys_event_leaves_the_view_of_the_policy_made_again_under_its_name(
    api: FakeApi, kube: KubeClient,
) -> None:
    old = builders.policy("p", TEN, generation=1, uid="u-old", node=builders.NODE, tenants=[builders.TENANT],
                          judged=True)
    new = builders.policy("p", TEN, generation=1, uid="u-new", node=builders.NODE, tenants=[builders.TENANT],
                          judged=True)
    new["metadata"]["finalizers"] = [FINALIZER]
    written: dict[str, tuple[str, float]] = {}
    assert await sync_view(kube, new, False, written, {}, 1.0)
    await sync_view(kube, old, True, {"p": ("old", 0.0)}, {"p": "old"}, 2.0)  # the old policy's late event
    view = api.get(view_path("p"))
    assert view is not None
    assert view["spec"]["policy"]["uid"] == "u-new"
    assert await sync_view(kube, new, True, written, {}, 3.0)
    assert api.get(view_path("p")) is None


def test_only_views_in_gpuslices_namespace_stand_for_a_policys_view() -> None:
    index = {key: [digest] for key, digest in {**view_index("gpuslice-system", "p", {APPLIED: "d"}),
                                               **view_index("tenant-a", "p", {APPLIED: "forged"}),
                                               **view_index("gpu-ops", "p", {APPLIED: "other"})}.items()}
    assert views({"view_index": index}) == {"p": "d"}
    assert views({"view_index": index}, "gpu-ops") == {"p": "other"}  # installed in another namespace
    assert views({"view_index": index}, "nowhere") == {}


async def test_views_are_written_and_deleted_in_the_controllers_namespace(api: FakeApi, kube: KubeClient) -> None:
    policy = builders.policy("p", TEN, generation=1, uid="u-p", node=builders.NODE, tenants=[builders.TENANT],
                             judged=True)
    policy["metadata"]["finalizers"] = [FINALIZER]
    written: dict[str, tuple[str, float]] = {}
    assert await sync_view(kube, policy, False, written, {}, 1.0, "gpu-ops")
    view = api.get(view_path("p", "gpu-ops"))
    assert view is not None
    assert view["metadata"]["namespace"] == "gpu-ops"
    assert api.get(view_path("p")) is None  # nothing in gpuslice-system
    assert await sync_view(kube, policy, True, written, {"p": "d"}, 2.0, "gpu-ops")
    assert api.get(view_path("p", "gpu-ops")) is None
