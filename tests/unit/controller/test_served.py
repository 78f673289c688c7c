"""What the server serves and keeps: the controller asks only for what it serves (a stock 1.36
serves no DeviceTaintRule, and a converge that listed it failed on every try), reports a field the
server drops rather than assume it kept, and a converge that keeps failing shows in the policy's
conditions between converges, not only in the log. The faults (a 404 of an unserved kind, a gate
that is off) are the fake API server's; the 1.36 tier runs the real thing (tests/cluster/k136)."""

from __future__ import annotations

from typing import Any

import kopf
import pytest

from gpuslice.controller.reconcile import reconcile
from gpuslice.controller.state import Context
from gpuslice.kube.client import KubeClient
from tests import builders
from tests.fakeapi import FakeApi
from tests.unit.controller.apiserver import enforce_tenancy, own_objects_only, world

USER = "system:serviceaccount:gpuslice-system:gpuslice-controller"
RULES = r"/apis/resource\.k8s\.io/v1/devicetaintrules"
UNSERVED = "the server could not find the requested resource"


@pytest.fixture
def stored_policy(api: FakeApi) -> dict[str, Any]:
    own_objects_only(api)
    enforce_tenancy(api)
    body = builders.policy("p", {"mode": "memory", "sliceSize": "10G"}, generation=1, uid="u-p", node=builders.NODE,
                           tenants=[builders.TENANT], extendedResourceName="example.com/gpu-slice")
    api.put(body, builders.namespace(builders.TENANT), builders.node())
    return body


def conditions(api: FakeApi) -> dict[str, tuple[str, str, str]]:
    status = (api.get(f"{builders.POLICIES}/p") or {}).get("status") or {}
    return {c["type"]: (c["status"], c["reason"], c["message"]) for c in status.get("conditions") or []}


async def test_a_server_that_serves_no_devicetaintrules_is_never_asked_for_them(
        api: FakeApi, kube: KubeClient, stored_policy: dict[str, Any]) -> None:
    api.fail("*", RULES, 404, UNSERVED, times=None)
    ctx = Context(kube=kube, username=USER, taint_rule_api=None)  # startup found none (dra.support.taint_rule_api)
    await reconcile(ctx, api.get(f"{builders.POLICIES}/p") or {}, world(api))
    await reconcile(ctx, api.get(f"{builders.POLICIES}/p") or {}, world(api), converge_objects=False)

    assert not [r for r in api.requests if "devicetaintrules" in r.path]
    assert ctx.unconverged == set()
    assert conditions(api)["Degraded"][:2] == ("False", "AsExpected")


async def test_a_converge_that_keeps_failing_shows_in_the_conditions_between_converges(
        api: FakeApi, kube: KubeClient, stored_policy: dict[str, Any]) -> None:
    # Listing a kind the server does not serve (what the controller did on a stock 1.36).
    cue = api.fail("GET", RULES, 404, UNSERVED, times=None)
    clock = [1000.0]
    ctx = Context(kube=kube, username=USER, taint_rule_api="resource.k8s.io/v1", clock=lambda: clock[0])
    with pytest.raises(kopf.TemporaryError):
        await reconcile(ctx, api.get(f"{builders.POLICIES}/p") or {}, world(api))
    failed = conditions(api)
    assert failed["Ready"][:2] == ("False", "ApplyFailed")
    assert failed["Degraded"][:2] == ("True", "ApplyFailed")
    assert f"listing DeviceTaintRule: {UNSERVED}" in failed["Degraded"][2]

    # The status timer's refreshes before the backoff is up do not converge: they must not say all is well.
    for _ in range(3):
        await reconcile(ctx, api.get(f"{builders.POLICIES}/p") or {}, world(api), converge_objects=False)
        assert conditions(api)["Ready"][:2] == ("False", "ApplyFailed")
        assert conditions(api)["Degraded"] == failed["Degraded"]

    cue.times = 0  # served again: the next converge succeeds and the conditions clear
    clock[0] += 3.0
    await reconcile(ctx, api.get(f"{builders.POLICIES}/p") or {}, world(api), converge_objects=False)
    assert conditions(api)["Degraded"][:2] == ("False", "AsExpected")
    assert ctx.unconverged == set()


async def test_a_failure_outside_the_converge_shows_once_it_keeps_coming_back(
        api: FakeApi, kube: KubeClient, stored_policy: dict[str, Any]) -> None:
    """A failure that is no converge error (the API server's own 503 on the tenancy probe) is no news
    the first times, and in the conditions from the third in a row."""
    probe = r"/apis/resource\.k8s\.io/v1/namespaces/gpuslice-system/resourceclaims"
    api.fail("POST", probe, 503, "etcdserver: leader changed", times=None)
    clock = [1000.0]
    ctx = Context(kube=kube, username=USER, clock=lambda: clock[0])
    for attempt in range(1, 4):
        with pytest.raises(kopf.TemporaryError):
            await reconcile(ctx, api.get(f"{builders.POLICIES}/p") or {}, world(api))
        clock[0] += 20.0
        assert ctx.policy("p").failed_because == ([] if attempt < 3 else [
            "reconciling failed (3 in a row): 503 ServiceUnavailable: etcdserver: leader changed"]), attempt
        if attempt < 3:
            assert conditions(api)["Degraded"][:2] == ("False", "AsExpected")
    assert conditions(api)["Degraded"] == ("True", "ApplyFailed", "reconciling failed (3 in a row): 503"
                                           " ServiceUnavailable: etcdserver: leader changed")


async def test_a_field_the_server_drops_is_reported_with_its_gate(
        api: FakeApi, kube: KubeClient, stored_policy: dict[str, Any]) -> None:
    api.drop("deviceclasses", "spec.extendedResourceName")  # DRAExtendedResource off (alpha on 1.35)
    ctx = Context(kube=kube, username=USER)
    with pytest.raises(kopf.TemporaryError):
        await reconcile(ctx, api.get(f"{builders.POLICIES}/p") or {}, world(api))

    degraded = conditions(api)["Degraded"]
    assert degraded[:2] == ("True", "ApplyFailed")
    assert "the API server stored DeviceClass p.gpuslice.dev without spec.extendedResourceName" in degraded[2]
    assert "DRAExtendedResource is off" in degraded[2]
