"""The controller's converge and reconcile (controller.apply, controller.reconcile) against the fake
API server, in seconds: a policy's objects are written, and only when they differ; what it no
longer wants goes; a name a tenant took and a write the server refuses are reported, not fatal;
and a failed converge is tried again after a growing delay, never in a loop. The cluster tier
(tests/cluster/controller) runs them with Kopf, a real API server and its admission policies."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import kopf
import pytest

from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.controller.apply import APPLIED, OWNED_KINDS, ApplyResult, converge
from gpuslice.controller.reconcile import reconcile
from gpuslice.controller.state import Context
from gpuslice.dra.names import LABEL_POLICY
from gpuslice.kube.client import KubeClient
from gpuslice.planning.cluster.cluster_objects import desired_objects
from tests import builders
from tests.fakeapi import FakeApi
from tests.unit.controller.apiserver import enforce_tenancy, own_objects_only, world

CLASS = "/apis/resource.k8s.io/v1/deviceclasses/p.gpuslice.dev"
TEMPLATES = "/apis/resource.k8s.io/v1/namespaces/{}/resourceclaimtemplates"
TEMPLATE = TEMPLATES.format(builders.TENANT) + "/gpu-slice"


@pytest.fixture(name="policy")
def served_policy(api: FakeApi) -> dict[str, Any]:
    """Policy ``p`` of tenant ``team-a``, on a cluster whose API server enforces gpuslice's rules."""
    own_objects_only(api)
    enforce_tenancy(api)
    body = builders.policy("p", {"mode": "memory", "sliceSize": "10G"}, generation=1, uid="u-p", node=builders.NODE,
                          tenants=[builders.TENANT])
    api.put(body, builders.namespace(builders.TENANT), builders.node())
    return body


def template(namespace: str, name: str, policy: str | None) -> dict[str, Any]:
    labels = {LABEL_POLICY: policy, "app.kubernetes.io/managed-by": "gpuslice"} if policy else {}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "x"}}]}}}}


async def converged(kube: KubeClient, body: dict[str, Any]) -> ApplyResult:
    desired = desired_objects(GpuSlicePolicy.from_body(body), {builders.TENANT})
    return await converge(kube, "p", [*desired.limits(), *desired.rest()], OWNED_KINDS)


Setup = Callable[[FakeApi], None]
# What is on the server before the converge -> (written, deleted, taken, errors: what each names).
CASES: dict[str, tuple[Setup, list[str], list[str], list[str], list[str]]] = {
    "nothing yet": (lambda api: None, [CLASS, TEMPLATE], [], [], []),
    "an object no longer wanted": (lambda api: api.put(template("gone", "gpu-slice", "p")),
                                   [CLASS, TEMPLATE], [TEMPLATES.format("gone") + "/gpu-slice"], [], []),
    "another policy's object": (lambda api: api.put(template("gone", "gpu-slice", "q")), [CLASS, TEMPLATE], [], [],
                                []),
    "a name a tenant took": (lambda api: api.put(template(builders.TENANT, "gpu-slice", None)), [CLASS], [],
                             [f"ResourceClaimTemplate {builders.TENANT}/gpu-slice"], []),
    "a write refused": (lambda api: api.fail("PATCH", CLASS, 422, "spec.selectors[0].cel.expression: Invalid"),
                        [TEMPLATE], [], [], ["applying DeviceClass p.gpuslice.dev: spec.selectors[0].cel.expression"]),
    "a write conflict": (lambda api: api.fail("PATCH", TEMPLATE, 409, "the object has been modified",
                                              reason="Conflict"),
                         [CLASS], [], [], [f"applying ResourceClaimTemplate {builders.TENANT}/gpu-slice: the object"]),
    "an immutable template": (lambda api: (api.put(template(builders.TENANT, "gpu-slice", "p")), api.fail(
        "PATCH", TEMPLATE, 422, "ResourceClaimTemplate.resource.k8s.io \"gpu-slice\" is invalid: spec: Invalid value:"
        " field is immutable")), [CLASS, TEMPLATE], [], [], []),
    "a list that fails": (lambda api: api.fail("GET", "/apis/resource.k8s.io/v1/deviceclasses", 503, "etcd",
                                               times=None), [TEMPLATE], [], [], ["listing DeviceClass: etcd"]),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
async def test_converge_writes_what_differs_and_reports_what_it_cannot(
        api: FakeApi, kube: KubeClient, policy: dict[str, Any],
        case: tuple[Setup, list[str], list[str], list[str], list[str]]) -> None:
    setup, written, deleted, taken, errors = case
    setup(api)

    result = await converged(kube, policy)

    assert (sorted(result.written), result.deleted, result.taken) == (sorted(written), deleted, taken)
    assert len(result.errors) == len(errors)
    assert all(e.startswith(words) for e, words in zip(result.errors, errors, strict=True)), result.errors
    for path in written:
        stored = api.get(path)
        assert stored is not None
        assert APPLIED in stored["metadata"]["annotations"]
    for path in deleted:
        assert api.get(path) is None
    since = len(api.requests)
    again = await converged(kube, policy)
    assert not set(again.written) & set(result.written), "what is as wanted is not written again"
    assert all(r.method in ("GET", "PATCH") for r in api.requests[since:])


# A converge that fails is tried again after a growing delay; once the fault is gone, it converges.

FAULTS: dict[str, Callable[[FakeApi], Any]] = {
    "a write refused": lambda api: api.fail("PATCH", CLASS, 422, "spec.config: Invalid", times=None),
    "a write conflict": lambda api: api.fail("PATCH", TEMPLATE, 409, "modified", reason="Conflict", times=None),
    "the status refused": lambda api: api.fail("PATCH", f"{builders.POLICIES}/p/status", 422,
                                               "status.tenants[0].limitBytes: Invalid", times=None),
    "the tenancy probe unanswered": lambda api: api.fail(
        "POST", TEMPLATES.format("gpuslice-system").replace("resourceclaimtemplates", "resourceclaims"), 503,
        "etcdserver: leader changed", times=None),
}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("fault", FAULTS.values(), ids=FAULTS.keys())
async def test_a_failed_converge_backs_off_and_converges_once_the_fault_is_gone(
        api: FakeApi, kube: KubeClient, policy: dict[str, Any], fault: Callable[[FakeApi], Any]) -> None:
    cue = fault(api)
    clock = Clock()
    ctx = Context(kube=kube, username="system:serviceaccount:gpuslice-system:gpuslice-controller", clock=clock)
    delays = []
    for _ in range(4):
        with pytest.raises(kopf.TemporaryError) as failed:
            await reconcile(ctx, api.get(f"{builders.POLICIES}/p") or {}, world(api))
        delays.append(failed.value.delay)
    transient = cue.refusal.code == 503
    assert delays == ([2.0, 4.0, 8.0, 10.0] if transient else [2.0, 4.0, 8.0, 16.0])
    assert ctx.unconverged == {"p"}, "the status timer converges it again when the delay is up"

    if not transient:  # judged: the status timer's refreshes do not converge again before the delay is up
        since = len(api.requests)
        with contextlib.suppress(kopf.TemporaryError):  # a status still refused fails the refresh too
            await reconcile(ctx, api.get(f"{builders.POLICIES}/p") or {}, world(api), converge_objects=False)
        assert not [r for r in api.requests[since:] if r.apply]
    cue.times = 0
    clock.now += 16.0
    await reconcile(ctx, api.get(f"{builders.POLICIES}/p") or {}, world(api), converge_objects=False)

    assert ctx.unconverged == set()
    assert api.get(CLASS) is not None
    assert api.get(TEMPLATE) is not None
    status = (api.get(f"{builders.POLICIES}/p") or {})["status"]
    assert [c["status"] for c in status["conditions"] if c["type"] == "Valid"] == ["True"]


async def test_a_drift_converge_reads_from_the_watches_and_one_probe_a_drift_interval_stands_for_all(
        api: FakeApi, kube: KubeClient, policy: dict[str, Any]) -> None:
    """Repairing drift every 120 s per policy cost a LIST per owned kind and a tenancy probe each:
    at 50 policies, 350 requests every two minutes whatever changed. Now what the policy owns comes
    from the watches, DeviceTaintRules (pruned only) are listed once, and one policy's probe a drift
    interval stands for all; a canary that finds tenancy gone has every policy probed again."""
    api.put(builders.policy("q", {"mode": "memory", "sliceSize": "20G"}, generation=1, uid="u-q", tenants=["team-b"],
                            node="n2"),
            builders.namespace("team-b"), builders.node("n2"))
    clock = Clock()
    ctx = Context(kube=kube, username="system:serviceaccount:gpuslice-system:gpuslice-controller", clock=clock,
                  canary_every=120.0)
    for name in ("p", "q"):
        await reconcile(ctx, api.get(f"{builders.POLICIES}/{name}") or {}, world(api))
    probes = [r for r in api.requests if r.method == "POST" and "/resourceclaims" in r.path]
    assert len(probes) == 2  # each generation is proved once it converges

    since = len(api.requests)
    clock.now += 60.0
    for name in ("p", "q"):
        await reconcile(ctx, api.get(f"{builders.POLICIES}/{name}") or {}, world(api))
    assert [str(r) for r in api.requests[since:]] == [], "a drift converge with nothing to repair makes no request"
    clock.now += 61.0
    for name in ("p", "q"):
        await reconcile(ctx, api.get(f"{builders.POLICIES}/{name}") or {}, world(api))
    canary = api.requests[since:]
    assert [(r.method, r.dry_run) for r in canary if r.method != "GET"] == [("POST", True)], "one canary for both"
    assert all("/validatingadmissionpolic" in r.path for r in canary if r.method == "GET")  # the probe's own

    # Someone takes the tenancy rule away: the next canary finds it, and every policy is probed again.
    api.admission.clear()
    since = len(api.requests)
    clock.now += 121.0
    with pytest.raises(kopf.TemporaryError):
        await reconcile(ctx, api.get(f"{builders.POLICIES}/p") or {}, world(api))
    assert ctx.stale_probe("q")
    with contextlib.suppress(kopf.TemporaryError):
        await reconcile(ctx, api.get(f"{builders.POLICIES}/q") or {}, world(api), converge_objects=False)
    valid = {n: [c["reason"] for c in (api.get(f"{builders.POLICIES}/{n}") or {})["status"]["conditions"]
                 if c["type"] == "Valid"] for n in ("p", "q")}
    assert valid == {"p": ["TenancyNotEnforced"], "q": ["TenancyNotEnforced"]}


async def test_a_converge_right_after_another_does_not_write_again_what_the_watch_has_not_shown_yet(
        api: FakeApi, kube: KubeClient, policy: dict[str, Any]) -> None:
    """Converges of one policy in a row (its creation, a quota's events) each compared what it wants
    with what the watches held when its handler started, before the last one's writes came back:
    every template written four times over as a fleet converged. The controller's own writes stand
    until the watch shows their version; an object the watch no longer shows is written again."""
    ctx = Context(kube=kube, username="system:serviceaccount:gpuslice-system:gpuslice-controller")
    await reconcile(ctx, api.get(f"{builders.POLICIES}/p") or {}, world(api))
    before = world(api)  # the watches as they were: the template as first written
    live = api.get(f"{builders.POLICIES}/p") or {}
    edited = {**live, "metadata": {**live["metadata"], "generation": 2},
              "spec": {**live["spec"], "slicing": {"mode": "memory", "sliceSize": "20G"}}}
    api.put(edited)
    since = len(api.requests)
    await reconcile(ctx, edited, world(api))
    changed = {r.path for r in api.requests[since:] if r.apply}
    assert CLASS in changed, "the class changes with the slice size"
    since = len(api.requests)
    await reconcile(ctx, edited, before, converge_objects=True)  # a handler that saw the first one
    assert not [str(r) for r in api.requests[since:] if r.apply], "written again from a stale view"
    api.remove(TEMPLATE)  # deleted by someone else since: the watch shows it gone
    await reconcile(ctx, edited, world(api), converge_objects=True)
    assert api.get(TEMPLATE) is not None, "put back"
