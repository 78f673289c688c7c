"""Hostile review, December (third round), R: the scheduler retry keeps its interval for one tenant
while other tenants keep many never-fitting pods waiting, in several namespaces, and keep making
new ones (a new pod has a new UID: a backoff kept per pod starts afresh for it).

The fix for R (3394d43) keeps the backoff per pod UID, at most one DeviceClass change per interval.
Here three namespaces of another policy hold a pod whose CEL selector no device matches and pods
kept out by another driver's claim, and every 5 s one of them is deleted and made again under a new
name (new UID, the same claims). Then the retry's own scenario (test_scheduler_retry.py): the
webhook stopped while 10 allocations are in flight, a 4Gi pod turned away, the webhook thawed.

A promise test (docs/memory-limits.md: pods turned away only by refused allocations in flight wait
up to --scheduler-retry-interval): it asserts the 4Gi pod is allocated within 45 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
from collections.abc import Awaitable, Callable
from typing import Any

from gpuslice.kube.client import KubeClient, KubeError, NotFound
from tests.cluster.claims import allocation, claim, pod_using, request
from tests.cluster.gpu_nodes import GpuNodeFactory
from tests.cluster.kubeutil import RESOURCE, wait_for
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory, WebhookProcess
from tests.cluster.pools import published
from tests.cluster.retries import is_turned_away, retry_stamp, two_claims
from tests.cluster.webhook.budgets import memory_claim, shared_tenant

POISON_SECONDS = 60
ELSEWHERE = "absent.churn.example.com"  # a class of another driver with no device anywhere





async def test_poison_pods_churned_across_namespaces_do_not_delay_my_retry(
    kube: KubeClient, controller: ControllerProcess, memory_webhook: WebhookProcess, make_policy: PolicyFactory,
    gpu_node: GpuNodeFactory, namespace: str, namespaces: Callable[..., Awaitable[str]],
) -> None:
    name, _ = await shared_tenant(kube, make_policy, gpu_node, namespace)
    klass = f"{name}.gpuslice.dev"
    claims = f"{RESOURCE}/namespaces/{namespace}/resourceclaims"
    others = [await namespaces(f"atk{i}") for i in range(3)]
    node = await gpu_node("h100-80gb", 1)
    poison_policy = (await make_policy({"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node.name}},
                                        "slicing": {"mode": "memory", "sliceSize": "10G"},
                                        "claimTemplateName": "atk-slice",
                                        "tenants": [{"namespace": o} for o in others]}, "-atk"))["metadata"]["name"]
    klass_poison = f"{poison_policy}.gpuslice.dev"
    await published(kube, node.name, 8)
    await kube.create(f"{RESOURCE}/deviceclasses", {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                                                    "metadata": {"name": ELSEWHERE}, "spec": {"selectors": [
                                                        {"cel": {"expression": f'device.driver == "{ELSEWHERE}"'}}]}})
    live: dict[str, list[str]] = {o: [] for o in others}
    stop = asyncio.Event()
    made_pods = 0

    async def made(ns: str, body: dict[str, Any]) -> bool:
        try:
            await kube.create(f"{RESOURCE}/namespaces/{ns}/resourceclaims", body)
        except KubeError as error:
            if "try again in a moment" in error.message:
                return False
            raise
        return True

    async def churn() -> None:
        nonlocal made_pods
        for generation in itertools.count(1):
            if stop.is_set():
                return
            ns = others[generation % len(others)]
            kept = [p for p in live[ns] if p.startswith("kept")]
            if kept:
                old = kept[0]
                with contextlib.suppress(NotFound):
                    await kube.delete(f"/api/v1/namespaces/{ns}/pods/{old}", gracePeriodSeconds=0)
                live[ns].remove(old)
                base = old.split("-g")[0]
                new = f"{base}-g{generation}"
                await kube.create(f"/api/v1/namespaces/{ns}/pods", two_claims(new, base, f"{base}-x"))
                live[ns].append(new)
                made_pods += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 5)

    task: asyncio.Task[None] | None = None
    try:
        for ns in others:
            selected = claim("poison", request(klass_poison, selectors=[
                {"cel": {"expression": "device.attributes['gpuslice.dev'].index == 99"}}]))
            await wait_for(lambda ns=ns, body=selected: made(ns, body), within=60, what=f"{ns} to be admitted")
            await kube.create(f"/api/v1/namespaces/{ns}/pods", pod_using("poison", "poison"))
            live[ns].append("poison")
            for i in range(2):
                await made(ns, claim(f"kept{i}", request(klass_poison)))
                await made(ns, claim(f"kept{i}-x", request(ELSEWHERE)))
                await kube.create(f"/api/v1/namespaces/{ns}/pods", two_claims(f"kept{i}", f"kept{i}", f"kept{i}-x"))
                live[ns].append(f"kept{i}")
        for ns in others:
            for pod in list(live[ns]):
                await wait_for(lambda ns=ns, pod=pod: is_turned_away(kube, ns, pod), within=60,
                               what=f"the poison pod {ns}/{pod} turned away")
        task = asyncio.create_task(churn())
        stamps: list[str] = []
        began = asyncio.get_running_loop().time()
        while asyncio.get_running_loop().time() - began < POISON_SECONDS:
            stamp = await retry_stamp(kube, klass_poison)
            if stamp and (not stamps or stamps[-1] != stamp):
                stamps.append(stamp)
            await asyncio.sleep(1)  # length: one read of the class's stamp a second, for the whole churn window
        print(f"R retry-at changes of the poison's class in {POISON_SECONDS} s of churn ({made_pods} pods made"
              f" again): {len(stamps)}: {stamps}")

        bigs = [f"big-{i}" for i in range(10)]
        for big, gib in zip(bigs, [8] * 9 + [7], strict=True):
            await kube.create(claims, memory_claim(big, klass, gib))
        await kube.create(claims, memory_claim("small", klass, 4))
        process = memory_webhook.process
        assert process is not None
        process.send_signal(signal.SIGSTOP)
        try:
            for big in bigs:
                await kube.create(f"/api/v1/namespaces/{namespace}/pods", pod_using(big, big))
            await asyncio.sleep(3)  # length: the 10 big pods' allocations reach the frozen webhook first
            await kube.create(f"/api/v1/namespaces/{namespace}/pods", pod_using("small", "small"))
            await wait_for(lambda: is_turned_away(kube, namespace, "small"), within=20, what="the 4Gi pod turned away")
        finally:
            process.send_signal(signal.SIGCONT)
        thawed = asyncio.get_running_loop().time()
        got = None
        while asyncio.get_running_loop().time() - thawed < 45:
            got = await allocation(kube, namespace, "small")
            if got:
                break
            await asyncio.sleep(1)  # length: one read a second of the claim, up to the 45 s the retry is given
        waited = asyncio.get_running_loop().time() - thawed
        lines = [line for line in controller.log_text().splitlines() if "turned away" in line][-2:]
        print(f"R small allocated: {bool(got)} after {waited:.0f} s ({made_pods} poison pods made again in all);"
              f" the controller said: {lines}")
        assert got, (f"the 4Gi pod, turned away only by refused allocations in flight, was not tried again within"
                     f" {waited:.0f} s (retry interval 3 s) while other tenants churned never-fitting pods")
    finally:
        stop.set()
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)
        for ns in others:
            for pod in live[ns]:
                with contextlib.suppress(NotFound):
                    await kube.delete(f"/api/v1/namespaces/{ns}/pods/{pod}", gracePeriodSeconds=0)
        with contextlib.suppress(NotFound):
            await kube.delete(f"{RESOURCE}/deviceclasses/{ELSEWHERE}")
        with contextlib.suppress(KubeError):
            await kube.delete(f"/api/v1/namespaces/{namespace}/pods", gracePeriodSeconds=0)
