"""An event handler reconciles one policy after another, each from the body it read at the start;
a user's edit in between has already been reconciled from the newer body. The older one must not
converge its spec over it (a tenant just removed would get its template and quota back)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from gpuslice.controller.reconcile import reconcile
from gpuslice.controller.state import Context
from gpuslice.controller.world import World
from gpuslice.kube.client import KubeClient
from tests.unit.controller.refusing import POLICY, WORLD, Refuses, templates


def edited(generation: int, tenants: list[str], uid: str = "u-1") -> dict[str, Any]:
    return {**POLICY, "metadata": {**POLICY["metadata"], "generation": generation, "uid": uid},
            "spec": {**POLICY["spec"], "tenants": [{"namespace": t} for t in tenants]}}


async def test_an_older_body_than_one_reconciled_changes_nothing() -> None:
    kube = Refuses()
    kube.refuse = False
    ctx = Context(kube=cast(KubeClient, kube), username="u")
    world = World(**{**WORLD.__dict__, "namespaces": {**WORLD.namespaces, "b": WORLD.namespaces["a"]}})
    await reconcile(ctx, edited(2, ["a"]), world)  # the edit removed tenant b
    kube.applied.clear()
    await reconcile(ctx, edited(1, ["a", "b"]), world)  # the handler's body from before the edit
    assert templates(kube) == []


async def test_a_policy_made_again_under_its_name_is_reconciled_from_its_first_generation() -> None:
    kube = Refuses()
    kube.refuse = False
    ctx = Context(kube=cast(KubeClient, kube), username="u")
    await reconcile(ctx, edited(5, ["a"]), WORLD)
    kube.applied.clear()
    await reconcile(ctx, edited(1, ["a"], uid="u-2"), WORLD)
    assert templates(kube) == ["/apis/resource.k8s.io/v1/namespaces/a/resourceclaimtemplates/gpu-slice"]


async def test_a_body_read_before_its_policy_was_deleted_brings_nothing_back() -> None:
    """A reconcile that waited on the policy's lock while its deletion finished (or an event's body
    read before it) would record the policy's status again: its metric series would then stay for
    good, and its objects be applied again until the owner references took them."""
    from gpuslice.controller.metrics import POLICY_METRICS

    kube = Refuses()
    kube.refuse = False
    ctx = Context(kube=cast(KubeClient, kube), username="u")
    await reconcile(ctx, edited(1, ["a"]), WORLD)
    assert str(POLICY["metadata"]["name"]) in POLICY_METRICS.policies
    ctx.forget(str(POLICY["metadata"]["name"]), "u-1")
    kube.applied.clear()
    await reconcile(ctx, edited(1, ["a"]), WORLD)
    assert str(POLICY["metadata"]["name"]) not in POLICY_METRICS.policies
    assert kube.applied == []
    await reconcile(ctx, edited(1, ["a"], uid="u-2"), WORLD)  # made again under its name: a new policy
    assert str(POLICY["metadata"]["name"]) in POLICY_METRICS.policies


async def test_a_reconcile_that_waited_on_a_deleted_policys_lock_keeps_its_records_for_the_new_one() -> None:
    """A policy made again under its name while a reconcile of it waited on the old one's lock: what
    that reconcile records is the new policy's, kept in its state, not in the one its deletion forgot."""
    kube = Refuses()
    kube.refuse = False
    ctx = Context(kube=cast(KubeClient, kube), username="u")
    name = str(POLICY["metadata"]["name"])
    old = ctx.policy(name)
    async with old.lock:  # the deletion's, while a reconcile of the policy made again waits
        waiting = asyncio.create_task(reconcile(ctx, edited(1, ["a"], uid="u-2"), WORLD))
        await asyncio.sleep(0)
        ctx.forget(name, "u-1")
    await waiting
    assert ctx.policies[name] is not old
    assert ctx.policies[name].newest == ("u-2", 1)
    assert ctx.policies[name].tenancy is not None, "its tenancy probe is recorded for it"
    assert old.newest is None
