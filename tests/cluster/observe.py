"""Waits on what the processes under test say they did, for tests that check that something does
not happen (nothing written, nothing more allocated, a deletion still waiting).

A fixed sleep says nothing about whether the process that could have done it ever looked: under
load it may not have run at all, and when idle the sleep is time thrown away. These wait until the
process has had its chance, counted by its own metrics or log, and the test then asserts that it
did nothing:

- the node agent: publish cycles (``gpuslice_agent_publish_cycles_total``), each woken on purpose;
- the kube-scheduler: its queues empty, nothing binding, nothing queued or tried across three reads;
- the controller: reconciles of one policy (``gpuslice_policy_reconciles_total``), the retries of a
  Kopf handler that keeps waiting (its "failed temporarily" log lines), and Auto defragmentation's
  looks (its log), each woken on purpose.
"""

from __future__ import annotations

import itertools
import json
import re
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from gpuslice.devcluster.cluster import DevCluster
from gpuslice.kube.client import KubeClient
from tests.cluster.kubeutil import RESOURCE, wait_for
from tests.cluster.operator_fixtures import ControllerProcess

Samples = dict[str, float]
Metrics = Callable[[], Awaitable[Samples]]
NUDGE = "gpuslice.dev/test-nudge"  # a Node label or claim annotation no gpuslice code reads
_nudges = itertools.count(1)
_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(text: str) -> Samples:
    """Prometheus' text format: each sample's name with its labels, and its value."""
    samples: Samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            samples[key] = float(value)
    return samples


async def scrape(url: str, tls: ssl.SSLContext | None = None) -> Samples:
    async with aiohttp.ClientSession() as session, session.get(url, ssl=tls if tls is not None else True) as response:
        return parse(await response.text())


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples that have ``labels`` (of every sample of it, with none)."""
    found = 0.0
    for key, value in samples.items():
        match = _SAMPLE.match(key)
        if match is None or match.group(1) != name:
            continue
        have = dict(_LABEL.findall(match.group(2) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            found += value
    return found


# The node agent

async def agent_cycles(kube: KubeClient, node: str, metrics: Metrics, count: int = 2) -> None:
    """Make ``node``'s agent run ``count`` successful publish cycles, one after another, each woken by
    a change of its Node that changes nothing it publishes, and wait for each. Cycles never overlap:
    the first one counted ended after this was called, and the next began after it ended, so with
    ``count`` of 2 or more the agent has planned at least once from the state as it was when this
    was called (and, the test then asserts, changed nothing)."""
    for _ in range(count):
        before = _cycles(await metrics())
        await kube.merge_patch(f"/api/v1/nodes/{node}", {"metadata": {"labels": {NUDGE: str(next(_nudges))}}})

        async def cycled(before: float = before) -> bool:
            return _cycles(await metrics()) > before

        await wait_for(cycled, within=30, what=f"a publish cycle of the agent on {node}")


def _cycles(samples: Samples) -> float:
    return sum(total(samples, "gpuslice_agent_publish_cycles_total", outcome=o) for o in ("unchanged", "written"))


# The kube-scheduler

_INSECURE = ssl.create_default_context()
_INSECURE.check_hostname, _INSECURE.verify_mode = False, ssl.CERT_NONE


async def scheduler_metrics(cluster: DevCluster) -> Samples:
    """The kube-scheduler's own metrics (self-signed TLS; read without the API server)."""
    return await scrape(cluster.scheduler_metrics, _INSECURE)


async def scheduler_settled(cluster: DevCluster, within: float = 60) -> None:
    """Wait until the kube-scheduler has nothing left to try: no pod in its active or backoff queue,
    none binding, no API call of its own pending, and nothing queued or attempted between two reads.
    Every pod not bound has then been tried since the last event that could let it fit, and is
    parked unschedulable: it is tried again only when something changes. (A pod in backoff waits up
    to 10 s for its next try, which a fixed sleep of a few seconds missed.) A pod taken from the
    queue and not yet tried is in none of them: quiet means three reads, a second in all, alike."""
    last: tuple[float, float] | None = None
    streak = 0

    async def settled() -> bool:
        nonlocal last, streak
        samples = await scheduler_metrics(cluster)
        busy = (total(samples, "scheduler_pending_pods", queue="active")
                + total(samples, "scheduler_pending_pods", queue="backoff")
                + total(samples, "scheduler_goroutines", operation="binding")
                + total(samples, "scheduler_pending_async_api_calls"))
        moved = (total(samples, "scheduler_queue_incoming_pods_total"), total(samples, "scheduler_schedule_attempts_total"))
        streak = streak + 1 if not busy and moved == last else 0
        last = moved
        return streak >= 2

    await wait_for(settled, within=within, what="the kube-scheduler to have nothing left to try", every=0.5)


async def scheduler_attempts(cluster: DevCluster, more: int, within: float = 60) -> None:
    """Wait until the kube-scheduler has made ``more`` scheduling attempts (of any result) from now:
    for pods it keeps retrying with a backoff (an error, such as a quota that refuses the claim it
    makes for a pod's extended resources), which are never parked."""
    before = total(await scheduler_metrics(cluster), "scheduler_schedule_attempts_total")

    async def tried() -> bool:
        return total(await scheduler_metrics(cluster), "scheduler_schedule_attempts_total") >= before + more

    await wait_for(tried, within=within, what=f"{more} more scheduling attempts", every=0.5)


async def scheduler_allocating(cluster: DevCluster, count: int, within: float = 60) -> None:
    """Wait until the kube-scheduler has ``count`` pods past their choice of devices, each waiting on
    its claim's allocation write (an admission webhook the test holds): pods in their binding
    cycle, or its API calls still pending."""
    async def held() -> bool:
        samples = await scheduler_metrics(cluster)
        return (total(samples, "scheduler_goroutines", operation="binding")
                + total(samples, "scheduler_pending_async_api_calls")) >= count

    await wait_for(held, within=within, what=f"the kube-scheduler to wait on {count} allocation writes", every=0.2)


# The controller

async def controller_metrics(controller: ControllerProcess) -> Samples:
    return await scrape(f"http://127.0.0.1:{controller.metrics_port}/metrics")


async def reconciles(controller: ControllerProcess, policy: str, kind: str | None = None) -> float:
    """How often this copy of the controller has reconciled ``policy`` (of ``kind``, or of any)."""
    labels = {"policy": policy, **({"kind": kind} if kind else {})}
    return total(await controller_metrics(controller), "gpuslice_policy_reconciles_total", **labels)


async def reconciled_again(controller: ControllerProcess, policy: str, kind: str | None = None, *, more: int = 1,
                           since: float | None = None, within: float = 60) -> None:
    """Wait until the controller has reconciled ``policy`` ``more`` times after ``since`` (the count
    then, by default now)."""
    start = since if since is not None else await reconciles(controller, policy, kind)

    async def done() -> bool:
        return await reconciles(controller, policy, kind) >= start + more

    await wait_for(done, within=within, what=f"{more} more reconciles of policy {policy}")


def log_entries(text: str) -> list[dict[str, Any]]:
    """The JSON lines of a process's log (the lines that are not JSON left out)."""
    found = []
    for line in text.splitlines():
        try:
            found.append(json.loads(line))
        except ValueError:
            continue
    return found


def handler_runs(controller: ControllerProcess, policy: str, handler: str) -> list[str]:
    """What Kopf logged of each run of ``handler`` (its function's name) of ``policy``: the rest of
    its "Handler '...' " lines ("failed temporarily: ...", "succeeded.", "failed permanently: ...")."""
    mark = f"{handler}' "
    return [event[event.index(mark) + len(mark):] for e in log_entries(controller.log_text())
            if e.get("policy") == policy and (event := str(e.get("event", ""))).startswith("Handler '")
            and mark in event]


async def handler_retried(controller: ControllerProcess, policy: str, handler: str, more: int = 1,
                          within: float = 60) -> None:
    """Wait until Kopf has run ``handler`` of ``policy`` ``more`` times again and each time it asked
    to wait (kopf.TemporaryError). A run that ends otherwise fails the test: at once when Kopf logs
    it (an error), by the timeout when it succeeded (the controller logs Kopf's per-object lines
    from warnings up, so a success leaves no line)."""
    before = len(handler_runs(controller, policy, handler))

    async def retried() -> bool:
        runs = handler_runs(controller, policy, handler)[before:]
        ended = [r for r in runs if not r.startswith("failed temporarily")]
        assert not ended, f"Kopf ran {handler} of policy {policy} again and it no longer waits: {ended[0]}"
        return len(runs) >= more

    await wait_for(retried, within=within, what=f"Kopf to run {handler} of policy {policy} {more} more times and find it must still wait")


def defrag_looks(controller: ControllerProcess, policy: str) -> int:
    """How often Auto defragmentation looked at ``policy`` and had waiting pods to help (its log)."""
    return sum(1 for e in log_entries(controller.log_text())
               if e.get("event") == "defragmentation looked" and e.get("policy") == policy)


async def defrag_looked(kube: KubeClient, controller: ControllerProcess, policy: str, namespace: str,
                        more: int = 2, within: float = 60) -> None:
    """Make Auto defragmentation look at ``policy`` ``more`` times again, each with pods waiting, and
    wait for each: what it did not do by then, it chose not to do. Auto looks again only when
    something changed since its last look (controller.defrag.auto), so each look is woken by a change
    of a claim in ``namespace`` (a tenant's) that changes nothing it plans from: an annotation."""
    claims = await kube.list(f"{RESOURCE}/namespaces/{namespace}/resourceclaims")
    assert claims, f"no claim in {namespace} to wake Auto defragmentation with"
    path = f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{claims[0]['metadata']['name']}"
    for _ in range(more):
        before = defrag_looks(controller, policy)
        await kube.merge_patch(path, {"metadata": {"annotations": {NUDGE: str(next(_nudges))}}})

        async def looked(before: int = before) -> bool:
            return defrag_looks(controller, policy) > before

        await wait_for(looked, within=within, what=f"Auto defragmentation to look at {policy} again")
