"""The scheduler retry backs off per pod: pods of another tenant that never fit (a claim whose CEL
selector no device matches; pods kept out by another driver's claim, which gpuslice does not judge)
never delay this tenant's retry. Without that, one poison pod stretched the gaps for everybody, and
a pod turned away only by refused allocations in flight waited for the scheduler's 5-minute flush."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable
from typing import Any

from gpuslice.devcluster.cluster import DevCluster
from gpuslice.kube.client import KubeClient, KubeError, NotFound
from tests.cluster.claims import allocation, claim, pod_using, request
from tests.cluster.gpu_nodes import GpuNodeFactory
from tests.cluster.kubeutil import RESOURCE, wait_for
from tests.cluster.observe import scheduler_allocating
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory, WebhookProcess
from tests.cluster.pools import published
from tests.cluster.retries import is_turned_away, retry_stamp, two_claims
from tests.cluster.webhook.budgets import memory_claim, shared_tenant

POISON_SECONDS = 100  # with the tests' 3 s interval, a backoff shared by all would reach 96 s by then
ELSEWHERE = "absent.retry.example.com"  # a class of another driver with no device anywhere





async def test_another_tenants_never_fitting_pods_do_not_delay_my_retry(
    cluster: DevCluster, kube: KubeClient, controller: ControllerProcess, memory_webhook: WebhookProcess, make_policy: PolicyFactory,
    gpu_node: GpuNodeFactory, namespace: str, namespaces: Callable[..., Awaitable[str]],
) -> None:
    name, _ = await shared_tenant(kube, make_policy, gpu_node, namespace)
    klass = f"{name}.gpuslice.dev"
    claims = f"{RESOURCE}/namespaces/{namespace}/resourceclaims"
    other = await namespaces("atk")
    node = await gpu_node("h100-80gb", 1)
    poison_policy = (await make_policy({"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node.name}},
                                        "slicing": {"mode": "memory", "sliceSize": "10G"},
                                        "claimTemplateName": "atk-slice", "tenants": [{"namespace": other}]},
                                       "-atk"))["metadata"]["name"]
    klass_poison = f"{poison_policy}.gpuslice.dev"
    await published(kube, node.name, 8)
    await kube.create(f"{RESOURCE}/deviceclasses", {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                                                    "metadata": {"name": ELSEWHERE}, "spec": {"selectors": [
                                                        {"cel": {"expression": f'device.driver == "{ELSEWHERE}"'}}]}})
    poisons = ["poison"] + [f"kept-{i}" for i in range(4)]
    try:
        # The poison of the review: a selector no device matches (a tenant may narrow its class).
        selected = claim("poison", request(klass_poison, selectors=[
            {"cel": {"expression": "device.attributes['gpuslice.dev'].index == 99"}}]))

        async def made(body: dict[str, Any]) -> bool:
            try:
                await kube.create(f"{RESOURCE}/namespaces/{other}/resourceclaims", body)
            except KubeError as error:
                if "try again in a moment" in error.message:
                    return False
                raise
            return True

        await wait_for(lambda: made(selected), within=60, what="the other tenant to be admitted")
        await kube.create(f"/api/v1/namespaces/{other}/pods", pod_using("poison", "poison"))
        # And pods whose slice fits, kept out by a claim of another driver that has no device: gpuslice
        # asks for them (that claim is the scheduler's to judge), and they are never helped.
        for kept in poisons[1:]:
            await made(claim(kept, request(klass_poison)))
            await made(claim(f"{kept}-x", request(ELSEWHERE)))
            await kube.create(f"/api/v1/namespaces/{other}/pods", two_claims(kept, kept, f"{kept}-x"))
        for pod in poisons:
            await wait_for(lambda pod=pod: is_turned_away(kube, other, pod), within=60,
                           what=f"the poison pod {pod} turned away")
        stamps: list[str] = []
        began = asyncio.get_running_loop().time()
        while asyncio.get_running_loop().time() - began < POISON_SECONDS:
            stamp = await retry_stamp(kube, klass_poison)
            if stamp and (not stamps or stamps[-1] != stamp):
                stamps.append(stamp)
            await asyncio.sleep(1)  # length: between two samples of the retry stamp
        print("retry-at changes of the poison's class while only the poison pods waited:", stamps)

        # The scenario the retry exists for (test_scheduler_retry.py), while the poison pods still wait.
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
            await scheduler_allocating(cluster, len(bigs))  # all ten placed, waiting on the frozen webhook
            await kube.create(f"/api/v1/namespaces/{namespace}/pods", pod_using("small", "small"))
            await wait_for(lambda: is_turned_away(kube, namespace, "small"), within=20,
                           what="the 4Gi pod turned away")
        finally:
            process.send_signal(signal.SIGCONT)
        thawed = asyncio.get_running_loop().time()
        got = None
        while asyncio.get_running_loop().time() - thawed < 45:
            got = await allocation(kube, namespace, "small")
            if got:
                break
            await asyncio.sleep(1)  # length: between two looks, each one's time measured
        waited = asyncio.get_running_loop().time() - thawed
        lines = [line for line in controller.log_text().splitlines() if "turned away" in line][-3:]
        print(f"small allocated: {bool(got)} after {waited:.0f} s; the controller said: {lines}")
        assert got, (f"the 4Gi pod, turned away only by refused allocations in flight, was not tried again within"
                     f" {waited:.0f} s (retry interval 3 s): the poison pods had backed the retry off for everyone")
        for pod in poisons:
            assert await is_turned_away(kube, other, pod), f"{other}/{pod} was placed: it was no poison"
    finally:
        # Nothing of the poison outlives the test: the controller's retry keeps no state past its pods.
        for pod in poisons:
            with contextlib.suppress(NotFound):
                await kube.delete(f"/api/v1/namespaces/{other}/pods/{pod}")
        with contextlib.suppress(NotFound):
            await kube.delete(f"{RESOURCE}/deviceclasses/{ELSEWHERE}")
