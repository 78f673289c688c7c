"""A converge that failed is retried by the next trigger once its backoff is up, even one that
normally only reports; the backoff doubles and is bounded, so bad input never loops.

Kopf does not retry event handlers (a tenant namespace appeared), so the 10 s status timer must
pick up a policy whose objects could not be written. The fault (the apiserver refusing a write)
is injected: a real apiserver cannot be made to refuse on cue.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any, cast

import kopf
import pytest

from gpuslice.controller.reconcile import reconcile
from gpuslice.controller.state import LAST_RETRY, TRANSIENT_RETRY, Context
from gpuslice.controller.tenancy import QuotaView
from gpuslice.dra.names import quota_resource
from gpuslice.kube.client import KubeClient, KubeError, ServerError
from tests.unit.controller.refusing import POLICY, WORLD, Refuses, templates


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_status_refresh_converges_again_once_the_backoff_is_up() -> None:
    kube, clock = Refuses(), Clock()
    ctx = Context(kube=cast(KubeClient, kube), username="system:serviceaccount:gpuslice:controller", clock=clock)

    with pytest.raises(kopf.TemporaryError, match="server is currently unable") as first:
        await reconcile(ctx, POLICY, WORLD)  # e.g. from the namespace event: Kopf will not retry it
    assert first.value.delay == 2.0
    kube.refuse = False

    await reconcile(ctx, POLICY, WORLD, converge_objects=False)  # the status timer, too early
    assert templates(kube) == []
    clock.now += 2.0
    await reconcile(ctx, POLICY, WORLD, converge_objects=False)  # the status timer, backoff up
    assert templates(kube) == ["/apis/resource.k8s.io/v1/namespaces/a/resourceclaimtemplates/gpu-slice"]

    kube.applied.clear()
    await reconcile(ctx, POLICY, WORLD, converge_objects=False)
    assert kube.applied == [], "once converged, the status timer goes back to reporting only"


async def test_backoff_doubles_and_is_bounded() -> None:
    kube, clock = Refuses(), Clock()
    ctx = Context(kube=cast(KubeClient, kube), username="u", clock=clock)
    delays = []
    for _ in range(12):
        with pytest.raises(kopf.TemporaryError) as failed:
            await reconcile(ctx, POLICY, WORLD)
        delays.append(failed.value.delay)
    assert delays[:5] == [2.0, 4.0, 8.0, 16.0, 32.0]
    assert max(delays) == LAST_RETRY == delays[-1]
    # A new generation is new input: its first failure is retried soon again.
    with pytest.raises(kopf.TemporaryError) as failed:
        await reconcile(ctx, {**POLICY, "metadata": {**POLICY["metadata"], "generation": 2}}, WORLD)
    assert failed.value.delay == 2.0


class Unready(Refuses):
    """An API server just restarted: writes fail (503) and the tenancy rule cannot be evaluated yet
    (its paramKind, a CRD, not yet in the server's REST mapper: the rule fails closed)."""

    def __init__(self) -> None:
        super().__init__()
        self.statuses: list[dict[str, Any]] = []

    async def apply(self, path: str, body: dict[str, Any], *, field_manager: str, force: bool = True) -> dict[str, Any]:
        if self.refuse and "/resourceclaimtemplates/" in path:
            raise ServerError(503, "ServiceUnavailable", "the server is currently unable to handle the request", None)
        return await super().apply(path, body, field_manager=field_manager, force=force)

    async def merge_patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        if path.endswith("/status"):
            self.statuses.append(patch)
        return patch

    async def request(self, method: str, path: str, body: Any = None, **_: Any) -> dict[str, Any]:
        raise KubeError(422, "Invalid", "resourceclaims.resource.k8s.io is forbidden: ValidatingAdmissionPolicy"
                        " 'gpuslice-tenancy' with binding 'gpuslice-tenancy' denied request: failed to configure"
                        " binding: failed to find resource referenced by paramKind: 'gpuslice.dev/v1alpha1,"
                        " Kind=GpuSlicePolicy'", None)


JUDGED = {**POLICY, "status": {"observedGeneration": 1, "conditions": [
    {"type": "Valid", "status": "True", "reason": "SpecValid", "message": "",
     "lastTransitionTime": "2026-11-29T10:00:00Z", "observedGeneration": 1}]}}


async def test_an_api_server_that_is_not_ready_is_asked_again_soon_and_nothing_is_reported_of_it() -> None:
    """A restarted controller and API server: the verdict the status holds for this generation
    stands (reporting it unverified would have every agent withdraw the policy's devices)."""
    kube, clock = Unready(), Clock()
    ctx = Context(kube=cast(KubeClient, kube), username="u", clock=clock)
    delays = []
    for _ in range(6):
        with pytest.raises(kopf.TemporaryError) as failed:
            await reconcile(ctx, JUDGED, WORLD)
        delays.append(failed.value.delay)
    assert delays == [2.0, 4.0, 8.0, TRANSIENT_RETRY, TRANSIENT_RETRY, TRANSIENT_RETRY]
    # The writes work again; the tenancy rule cannot be evaluated yet: asked again soon, and the
    # policy is not reported as unenforced meanwhile.
    kube.refuse = False
    with pytest.raises(kopf.TemporaryError, match="failed to configure") as failed:
        await reconcile(ctx, JUDGED, WORLD)
    assert failed.value.delay == TRANSIENT_RETRY
    assert not [p for p in kube.statuses if "TenancyNotEnforced" in str(p)]


async def test_a_new_policy_whose_probe_gets_no_verdict_says_it_is_unverified_and_why() -> None:
    """Never judged, it has nothing to keep: its status says why there is no verdict yet (it showed
    no Valid condition at all until an answer came)."""
    kube, clock = Unready(), Clock()
    kube.refuse = False
    ctx = Context(kube=cast(KubeClient, kube), username="u", clock=clock)
    with pytest.raises(kopf.TemporaryError, match="failed to configure") as failed:
        await reconcile(ctx, POLICY, WORLD)
    assert failed.value.delay == 2.0
    valid = next(c for p in kube.statuses for c in (p["status"].get("conditions") or []) if c["type"] == "Valid")
    assert (valid["status"], valid["reason"]) == ("False", "TenancyNotEnforced")
    assert "not yet verified" in valid["message"]
    assert "failed to configure binding" in valid["message"]


async def test_a_tenant_waiting_on_a_clock_far_behind_is_looked_at_again_by_the_status_timer() -> None:
    """A limited tenant is admitted a second after its quota was made. With the controller's clock
    far behind the apiserver's, a reconcile does not wait that long: it marks the policy, so the
    status timer (which otherwise refreshes only what changed) looks again."""
    kube = Refuses()
    kube.refuse = False
    ctx = Context(kube=cast(KubeClient, kube), username="u")
    limited = {**POLICY, "spec": {**POLICY["spec"], "tenants": [{"namespace": "a", "maxSlices": 2}]}}
    ahead = (datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
    hard = {quota_resource("team-a.gpuslice.dev"): "2"}
    world = dataclasses.replace(WORLD, policies={"team-a": limited},
                                quotas={("a", "gpuslice-team-a"): QuotaView("team-a", ahead, hard)})
    await reconcile(ctx, limited, world)
    assert ctx.policies["team-a"].admitted == []
    assert "team-a" in ctx.clock_waits
    now = dataclasses.replace(world, quotas={("a", "gpuslice-team-a"): QuotaView("team-a", "2026-11-29T10:00:00Z", hard)})
    await reconcile(ctx, limited, now, converge_objects=False)
    assert [a.namespace for a in ctx.policies["team-a"].admitted] == ["a"]
    assert "team-a" not in ctx.clock_waits
