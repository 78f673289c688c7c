"""Defragmentation on a fragmented fake node with a pod runner, so the moved pods' replacements
really run: gpuslice defrag plans and applies the fewest moves, skips what may not move, the
Eviction API and PodDisruptionBudgets decide, nothing stays tainted, and the controller killed
halfway evicts nothing twice."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from gpuslice.devcluster.cluster import DevCluster
from gpuslice.kube.client import KubeClient, KubeError
from tests.cluster.kubeutil import pod_with_claim, wait_for
from tests.cluster.metric_names import scrape
from tests.cluster.observe import defrag_looked
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory
from tests.cluster.plugin.defrag_fleet import GPUS, Fragmented, make_fragmented
from tests.cluster.plugin.plugin_nodes import PluginNode, PluginNodeFactory, event_with, pod_events, running

# In the scheduler's order of devices: two Deployments' pods on the first GPU (the one to free, and
# the first place a replacement would go but for the taint), a bare pod and a Deployment's on the
# second (as few pods, but one may not move), three Deployments' on the third.
LAYOUT = [[("dep", "web-e"), ("dep", "web-f")], [("bare", "bare-0"), ("dep", "web-a")],
          [("dep", "web-b"), ("dep", "web-c"), ("dep", "web-d")]]


def laid(namespace: str, *, where: dict[str, str] | None = None) -> list[list[tuple[str, str, str]]]:
    return [[(kind, name, (where or {}).get(name, namespace)) for kind, name in gpu] for gpu in LAYOUT]


async def waiting_big(fleet: Fragmented, namespace: str) -> None:
    await fleet.kube.create(f"/api/v1/namespaces/{namespace}/pods", pod_with_claim("big", "gpu-slice-full"))

    async def unschedulable() -> bool:
        pod = await fleet.kube.get(f"/api/v1/namespaces/{namespace}/pods/big")
        return any(c.get("reason") == "Unschedulable" for c in (pod.get("status") or {}).get("conditions") or [])

    await wait_for(unschedulable, within=60, what="the whole-GPU pod to be unschedulable")


async def fragmented_and_waiting(kube: KubeClient, cluster: DevCluster, plugin_node: PluginNodeFactory,
                                 make_policy: PolicyFactory, namespace: str) -> tuple[PluginNode, Fragmented]:
    """The LAYOUT on a new node, and a whole-GPU pod "big" waiting."""
    node = await plugin_node("h100-80gb", GPUS)
    fleet = await make_fragmented(kube, cluster, node, make_policy, [namespace])
    await fleet.lay_out(laid(namespace))
    await waiting_big(fleet, namespace)
    return node, fleet


def option(plan: dict[str, Any], index: int) -> dict[str, Any]:
    found = [o for o in [plan.get("target"), *plan["alternatives"]] if o and o["index"] == index]
    assert found, plan
    return found[0]


async def test_apply_frees_the_gpu_with_the_fewest_movable_pods_and_every_deployment_comes_back(
    kube: KubeClient, cluster: DevCluster, controller: ControllerProcess, make_policy: PolicyFactory,
    plugin_node: PluginNodeFactory, namespace: str,
) -> None:
    node, fleet = await fragmented_and_waiting(kube, cluster, plugin_node, make_policy, namespace)
    before = await fleet.uids([namespace])

    [plan] = fleet.plan_json()
    assert plan["verdict"] == "Ready", plan
    assert plan["target"]["index"] == fleet.gpu("web-e")
    assert sorted(m["pod"] for m in plan["target"]["moves"]) == sorted(
        f"{namespace}/{fleet.placed[n][1]}" for n in ("web-e", "web-f"))
    bare = option(plan, fleet.gpu("bare-0"))
    assert [b["code"] for b in bare["blockers"]] == ["Bare"], "the fewest pods, but one is bare"
    assert len(option(plan, fleet.gpu("web-b"))["moves"]) == 3

    why = await asyncio.to_thread(_gpuslice, cluster, "why", f"{namespace}/big", "-o", "json")
    [finding] = [f for f in json.loads(why)["findings"] if f["code"] == "Defragmentation"]
    assert "Moving 2 pods" in finding["message"]
    assert f"{node.name} GPU {fleet.gpu('web-e')}" in finding["message"]

    # Another whole-GPU pod, younger: the GPU freed for "big" goes to "big" (the tenancy rule refuses it
    # any other claim), and no other GPU can be freed for this one (its pods would have nowhere to go).
    await fleet.kube.create(f"/api/v1/namespaces/{namespace}/pods", pod_with_claim("rival", "gpu-slice-full"))
    done = await asyncio.to_thread(fleet.cli, "--apply", "--timeout", "150")
    assert "Freed" in done.stdout, done.stdout + done.stderr
    assert done.returncode == 1, "the rival could not be helped"
    # A bound, not a timing: the kubelet prepares big only once it has unprepared the evicted pods'
    # claims (the agent refuses a device a prepared claim still holds), retrying with its own backoff,
    # which under a loaded machine took over a minute in two full runs of the tier.
    await running(kube, namespace, ["big"], within=150)
    assert await fleet.gpu_of(namespace, "big") == fleet.gpu("web-e")
    assert (await kube.get(f"/api/v1/namespaces/{namespace}/pods/rival"))["status"]["phase"] == "Pending"
    await fleet.deployments_ready(namespace, [n for gpu in LAYOUT for k, n in gpu if k == "dep"])
    after = await fleet.uids([namespace])
    moved = {p for p in before if before[p] != after.get(p)}
    assert moved == {f"{namespace}/{fleet.placed[n][1]}" for n in ("web-e", "web-f")}, "only the plan's pods moved"
    replacements = [p.split("/")[1] for p in after if p not in before]
    assert fleet.gpu("web-e") not in {await fleet.gpu_of(namespace, p) for p in replacements if p.startswith("web-")}
    for pod in replacements:  # steered off by the taint: the scheduler never even tried the freed GPU for them
        assert not [e for e in await pod_events(kube, namespace, pod) if "is being freed" in e.get("message", "")], pod
    await wait_for(lambda: _none(fleet.defrag_tainted), within=30, what="the taint to lift once the claim is allocated")
    status = await wait_for(fleet.ended, within=30, what="the move's record to go")
    assert status.get("inFlight") in (None, [])
    assert status["last"]["outcome"] == "Freed"
    for name in ("web-e", "web-f"):
        event = await event_with(kube, namespace, fleet.placed[name][1],
                                 f"moved by gpuslice to free GPU {fleet.gpu('web-e')} of node {node.name}")
        assert f"for pod {namespace}/big" in event["message"]
    await event_with(kube, namespace, "big", "was freed")
    metrics = await scrape(controller.metrics_port)
    assert f'gpuslice_defrag_evictions_total{{by="manual",policy="{fleet.policy}"}} 2.0' in metrics
    assert f'gpuslice_defrag_gpus_freed_total{{by="manual",policy="{fleet.policy}"}} 1.0' in metrics


async def test_a_budget_and_an_opted_out_tenant_block_their_gpus_and_the_plan_says_so(
    kube: KubeClient, cluster: DevCluster, controller: ControllerProcess, make_policy: PolicyFactory,
    plugin_node: PluginNodeFactory, namespace: str, namespaces: Callable[..., Awaitable[str]],
) -> None:
    node = await plugin_node("h100-80gb", GPUS)
    quiet = await namespaces("quiet", {"gpuslice.dev/defrag": "false"})
    fleet = await make_fragmented(kube, cluster, node, make_policy, [namespace, quiet])
    await fleet.lay_out(laid(namespace, where={"web-c": quiet}))
    await kube.create(f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets", {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "keep-e"},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "web-e"}}}})
    await waiting_big(fleet, namespace)
    before = await fleet.uids([namespace, quiet])

    async def planned() -> dict[str, Any] | None:
        [plan] = await asyncio.to_thread(fleet.plan_json)
        blockers = option(plan, fleet.gpu("web-e"))["blockers"]
        return plan if any(b["code"] == "Disruption" for b in blockers) else None

    plan = await wait_for(planned, within=60, what="the disruption controller to count the budget")
    assert plan["verdict"] == "Blocked"
    assert [b["code"] for b in option(plan, fleet.gpu("bare-0"))["blockers"]] == ["Bare"]
    assert [b["code"] for b in option(plan, fleet.gpu("web-b"))["blockers"]] == ["OptedOut"]
    blocker = option(plan, fleet.gpu("web-e"))["blockers"][0]["message"]
    assert f"PodDisruptionBudget {namespace}/keep-e allows no disruption" in blocker
    text = await asyncio.to_thread(fleet.cli)
    assert "blocked" in text.stdout, text.stdout
    assert "keep-e" in text.stdout

    done = await asyncio.to_thread(fleet.cli, "--apply", "--timeout", "60")
    assert done.returncode == 1, "a pod that could not be helped"
    assert await fleet.uids([namespace, quiet]) == before, "nothing was evicted"
    assert await fleet.defrag_tainted() == []


@pytest.mark.parametrize("budgets", [{"keep-f": 0}, {"keep-f": 5, "also-f": 5}], ids=["none-allowed", "two-budgets"])
async def test_an_eviction_a_budget_refuses_ends_the_move_and_lifts_the_taint(
    kube: KubeClient, cluster: DevCluster, controller: ControllerProcess, make_policy: PolicyFactory,
    plugin_node: PluginNodeFactory, namespace: str, budgets: dict[str, int],
) -> None:
    """A budget that allows no disruption of the second pod of a move, or two budgets that select
    it (which the Eviction API refuses with a 500 however much they allow), made after the plan
    and after the controller judged the move (it is recorded as the controller records a move it
    took up: a request made after the budget is refused before anything is evicted): the first
    eviction passes, the Eviction API refuses the second, and the move stops there."""
    from gpuslice.controller.defrag.move import new_move, now_utc, start
    from gpuslice.planning.defrag.model import Plan

    _node, fleet = await fragmented_and_waiting(kube, cluster, plugin_node, make_policy, namespace)
    [plan_body] = fleet.plan_json()
    assert [m["pod"].split("/")[1].rsplit("-", 2)[0] for m in plan_body["target"]["moves"]] == ["web-e", "web-f"]
    for name, unavailable in budgets.items():
        await kube.create(f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets", {
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": name},
            "spec": {"maxUnavailable": unavailable, "selector": {"matchLabels": {"app": "web-f"}}}})

    async def counted() -> bool:
        for name in budgets:
            budget = await kube.get(f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/{name}")
            if (budget.get("status") or {}).get("observedGeneration") != budget["metadata"]["generation"]:
                return False
        return True

    await wait_for(counted, within=60, what="the disruption controller to count the budgets")
    before = await fleet.uids([namespace])
    move = new_move(_plan(Plan, plan_body), "a test", now_utc(), 120, phase="Tainting")
    async with await KubeClient.from_kubeconfig(controller.kubeconfig) as as_controller:
        assert await start(as_controller, fleet.policy, move, []) is None

    async def ended() -> dict[str, Any] | None:
        last = ((await fleet.policy_status()).get("defragmentation") or {}).get("last") or {}
        return last if last.get("id") == move.id else None

    last = await wait_for(ended, within=90, what="the move to end")
    assert last["outcome"] == "Failed"
    assert f"the eviction of {namespace}/{fleet.placed['web-f'][1]} was refused" in last["message"], last
    after = await fleet.uids([namespace])
    assert {p for p in before if before[p] != after.get(p)} == {f"{namespace}/{fleet.placed['web-e'][1]}"}
    await wait_for(lambda: _none(fleet.defrag_tainted), within=30, what="the taint to lift")
    await event_with(kube, namespace, "big", f"gpuslice gave up freeing GPU {fleet.gpu('web-e')}")
    metrics = await scrape(controller.metrics_port)
    assert f'gpuslice_defrag_moves_failed_total{{policy="{fleet.policy}",reason="Disruption"}} 1.0' in metrics


async def test_the_controller_killed_between_an_eviction_and_its_record_evicts_nothing_twice(
    kube: KubeClient, cluster: DevCluster, controller: ControllerProcess, controller_kubeconfig: Path,
    make_policy: PolicyFactory, plugin_node: PluginNodeFactory, namespace: str, tmp_path: Path,
) -> None:
    node, fleet = await fragmented_and_waiting(kube, cluster, plugin_node, make_policy, namespace)
    before = await fleet.uids([namespace])
    await controller.stop()
    doomed = ControllerProcess(controller_kubeconfig, tmp_path / "doomed.log",
                               {"GPUSLICE_FAILPOINTS": "controller.defrag-evicted=kill"})
    doomed.start()
    applying = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpuslice", "defrag", "--apply", "--timeout", "200", "--kubeconfig",
        str(cluster.kubeconfig), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        async def killed() -> bool:
            return doomed.process is not None and doomed.process.poll() == -signal.SIGKILL

        await wait_for(killed, within=120, what="the controller to die right after its first eviction")
        status = await fleet.policy_status()
        [move] = status["defragmentation"]["inFlight"]
        assert not move.get("evicted"), "killed before the eviction was recorded"
        assert await fleet.defrag_tainted(), "the GPU stays tainted while its move is recorded"
        report = json.loads(await asyncio.to_thread(_gpuslice, cluster, "status", "-o", "json"))
        [freeing] = [g for n in report["map"]["nodes"] for g in n["gpus"] if g["freeing"]]
        assert (freeing["node"], freeing["index"]) == (node.name, fleet.gpu("web-e"))
        assert f"being freed for {namespace}/big" in freeing["freeing"]
        doomed.process = None
        controller.start()
        async with asyncio.timeout(240):
            output, _ = await applying.communicate()
        assert applying.returncode == 0, output.decode()
    finally:
        if applying.returncode is None:
            applying.kill()
        if controller.process is None:
            controller.start()
    await running(kube, namespace, ["big"], within=60)
    after = await fleet.uids([namespace])
    moved = {p for p in before if before[p] != after.get(p)}
    assert moved == {f"{namespace}/{fleet.placed[n][1]}" for n in ("web-e", "web-f")}
    for pod in after:  # the replacements were left alone
        assert not [e for e in await pod_events(kube, namespace, pod.split("/")[1])
                    if e.get("reason") == "MovedByGpuslice"], pod
    evicted_events = [e for name in ("web-e", "web-f")
                      for e in await pod_events(kube, namespace, fleet.placed[name][1])
                      if e.get("reason") == "MovedByGpuslice"]
    assert all(int(e.get("count") or 1) == 1 for e in evicted_events), "no pod evicted twice"
    await wait_for(lambda: _none(fleet.defrag_tainted), within=30, what="the taint to lift")


async def test_auto_mode_moves_pods_only_within_its_hourly_budget(
    kube: KubeClient, cluster: DevCluster, controller: ControllerProcess, make_policy: PolicyFactory,
    plugin_node: PluginNodeFactory, namespace: str,
) -> None:
    from tests.cluster.kubeutil import POLICIES

    node = await plugin_node("h100-80gb", GPUS)
    auto = {"defragmentation": {"mode": "Auto", "maxEvictionsPerHour": 1, "minPendingSeconds": 0}}
    fleet = await make_fragmented(kube, cluster, node, make_policy, [namespace], auto)
    await fleet.lay_out(laid(namespace))
    before = await fleet.uids([namespace])
    await waiting_big(fleet, namespace)
    event = await event_with(kube, namespace, "big", "maxEvictionsPerHour is 1", within=60)
    assert event["reason"] == "DefragmentationBlocked"
    await defrag_looked(kube, controller, fleet.policy, namespace)  # two more looks: still nothing
    still = await fleet.uids([namespace])
    assert all(still.get(pod) == uid for pod, uid in before.items()), "nothing was evicted"
    metrics = await scrape(controller.metrics_port)
    assert f'gpuslice_defrag_plans_blocked_total{{policy="{fleet.policy}",reason="Budget"}} 1.0' in metrics

    await kube.merge_patch(f"{POLICIES}/{fleet.policy}", {"spec": {"defragmentation": {"maxEvictionsPerHour": 2}}})
    await running(kube, namespace, ["big"], within=120)

    status = await wait_for(fleet.ended, within=30, what="the move's record to go")
    assert len(status["evictions"]) == 2, "the hour's evictions are recorded against the budget"
    assert status["last"]["outcome"] == "Freed"
    after = await fleet.uids([namespace])
    assert {p for p in before if before[p] != after.get(p)} == {
        f"{namespace}/{fleet.placed[n][1]}" for n in ("web-e", "web-f")}
    await wait_for(lambda: _none(fleet.defrag_tainted), within=30, what="the taint to lift")
    metrics = await scrape(controller.metrics_port)
    assert f'gpuslice_defrag_evictions_total{{by="auto",policy="{fleet.policy}"}} 2.0' in metrics


async def _none(read: Callable[[], Awaitable[list[str]]]) -> bool:
    return not await read()


def _plan(kind: type[Any], body: dict[str, Any]) -> Any:
    """A plan as gpuslice defrag -o json printed it, typed again."""
    from gpuslice.planning.defrag.model import GpuOption, Move

    target = body["target"]
    option = GpuOption(target["node"], target["index"], target["uuid"], target["device"],
                       tuple(Move(m["pod"], m["uid"], m["owner"], tuple(m["devices"]), m["memory"], m["to"])
                             for m in target["moves"]))
    return kind(body["pod"], body["podUid"], body["claim"], body["claimUid"], body["policy"], body["kind"],
                body["since"], body["verdict"], body["message"], option)


async def test_a_gpu_being_freed_goes_to_the_claim_it_is_freed_for_and_no_other(
    kube: KubeClient, cluster: DevCluster, controller: ControllerProcess, make_policy: PolicyFactory,
    plugin_node: PluginNodeFactory, namespace: str,
) -> None:
    """The tenancy rule, with the scheduler's write of an allocation made by hand (so that which claim
    the scheduler tries first does not matter): while a move is recorded for a GPU, a device of it is
    allocated only to the waiting claim (or one its pod owns)."""
    from gpuslice.api.status import DefragMove, ObjectRef
    from gpuslice.controller.defrag.move import now_utc, stamp, start, update_defrag
    from tests.cluster.pools import tag

    node = await plugin_node("h100-80gb", 1)
    fleet = await make_fragmented(kube, cluster, node, make_policy, [namespace], gpus=1)
    claims = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"
    full = f"full.{fleet.policy}.gpuslice.dev"
    made = {}
    big = await kube.create(f"/api/v1/namespaces/{namespace}/pods", {  # only its UID matters
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "big"},
        "spec": {"containers": [{"name": "work", "image": "registry.k8s.io/pause:3.10"}]}})
    for name, owner in (("waiting", None), ("other", None), ("owned", big["metadata"]["uid"])):
        body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": full}}]}}}
        if owner:
            body["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": "big", "uid": owner}]
        made[name] = await wait_for(lambda b=body: _created(kube, claims, b), within=30, what=f"claim {name}")
    gpu_tag = tag(node.name)
    # A move as the controller records one it judged (phase Tainting, which only the controller may write:
    # the rule honours no move before): written here with its identity.
    move = DefragMove(id="d-test", node=node.name, gpu="GPU-unused", gpu_tag=gpu_tag, device="x",
                      claim=ObjectRef(namespace=namespace, name="waiting", uid=made["waiting"]["metadata"]["uid"]),
                      pod=ObjectRef(namespace=namespace, name="big", uid=big["metadata"]["uid"]), by="a test",
                      phase="Tainting", started=stamp(now_utc()), expires="2099-01-01T00:00:00Z")
    async with await KubeClient.from_kubeconfig(controller.kubeconfig) as as_controller:
        assert await start(as_controller, fleet.policy, move, []) is None

    async def allocate(name: str) -> str:
        body = await kube.get(f"{claims}/{name}")
        body["status"] = {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "gpu.gpuslice.dev", "pool": node.name,
             "device": f"{gpu_tag}-{fleet.policy}-full"}]},
            # As the scheduler writes it: the tenancy rule takes a policy's device only from the pool
            # of the node the allocation is for.
            "nodeSelector": {"nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node.name]}]}]}}}
        try:
            await kube.request("PUT", f"{claims}/{name}/status", body, query={"dryRun": "All"})
        except KubeError as error:
            return error.message
        return "admitted"

    async def refused_other() -> str | None:
        said = await allocate("other")
        return said if "is being freed by gpuslice" in said else None

    said = await wait_for(refused_other, within=30, what="the tenancy rule to keep the GPU for the waiting claim")
    assert f"for pod {namespace}/big" in said
    assert await allocate("waiting") == "admitted"
    assert await allocate("owned") == "admitted", "a claim the waiting pod owns (its extended resources)"
    await update_defrag(kube, fleet.policy, lambda c: c.model_copy(update={"in_flight": []}))

    async def admitted_other() -> bool:
        return await allocate("other") == "admitted"

    await wait_for(admitted_other, within=30, what="the GPU to be anyone's once the move is gone")


async def _created(kube: KubeClient, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
    try:
        return await kube.create(path, body)
    except KubeError as error:
        if "try again in a moment" in error.message:  # the tenant's quota on its way
            return None
        raise


def _gpuslice(cluster: DevCluster, *args: str) -> str:
    """A gpuslice command as a platform engineer runs it; its output."""
    done = subprocess.run([sys.executable, "-m", "gpuslice", *args, "--kubeconfig", str(cluster.kubeconfig)],
                          capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode in (0, 1), done.stderr
    return done.stdout


async def test_auto_mode_frees_one_gpu_after_another_for_two_waiting_pods(
    kube: KubeClient, cluster: DevCluster, controller: ControllerProcess, make_policy: PolicyFactory,
    plugin_node: PluginNodeFactory, namespace: str,
) -> None:
    """One Deployment's pod on each GPU and two whole-GPU pods waiting: Auto frees a GPU for the older
    (one eviction), then, once that move is over, another for the younger (one more: the replacement
    went to one of the other two GPUs, and the GPU left with one pod is the one to free)."""
    node = await plugin_node("h100-80gb", GPUS)
    auto = {"defragmentation": {"mode": "Auto", "maxEvictionsPerHour": 10, "minPendingSeconds": 0}}
    fleet = await make_fragmented(kube, cluster, node, make_policy, [namespace], auto)
    apps = ["web-a", "web-b", "web-c"]
    await fleet.lay_out([[("dep", app, namespace)] for app in apps])
    await waiting_big(fleet, namespace)
    await fleet.kube.create(f"/api/v1/namespaces/{namespace}/pods", pod_with_claim("big-2", "gpu-slice-full"))

    await running(kube, namespace, ["big", "big-2"], within=240)
    assert await fleet.gpu_of(namespace, "big") != await fleet.gpu_of(namespace, "big-2")
    await fleet.deployments_ready(namespace, apps)
    async def both_ended() -> dict[str, Any] | None:
        status = await fleet.policy_status()
        found = status.get("defragmentation") or {}
        return dict(found) if found.get("last") and not found.get("inFlight") else None

    status = await wait_for(both_ended, within=30, what="the second move's record to go")
    assert status["last"]["outcome"] == "Freed"
    assert "big-2" in status["last"]["message"], status["last"]
    assert len(status["evictions"]) == 2, "one pod moved for each GPU: the fewest"
    for pod in ("big", "big-2"):
        await event_with(kube, namespace, pod, "was freed")
    await wait_for(lambda: _none(fleet.defrag_tainted), within=30, what="the taints to lift")
    metrics = await scrape(controller.metrics_port)
    assert f'gpuslice_defrag_gpus_freed_total{{by="auto",policy="{fleet.policy}"}} 2.0' in metrics
    assert f'gpuslice_defrag_evictions_total{{by="auto",policy="{fleet.policy}"}} 2.0' in metrics
    assert '"defragmentation looked"' in controller.log.read_text(), "Auto logs what each look found"
