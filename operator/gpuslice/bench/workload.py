"""Layouts applied to a bench cluster, and pods placed on them through the real scheduler."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuslice.agent.gpus.fake import FakeBackend
from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.bench.harness import (
    BenchCluster,
    BenchError,
    cpu_seconds,
    create,
    gather_limited,
    wait_until,
)
from gpuslice.bench.layouts import WHOLE_CLASS, Layout, whole_gpu_class, whole_gpu_slice
from gpuslice.coordinates import (
    NAMESPACES,
    POLICIES,
    claim_path,
    claims_in,
    device_class_path,
    object_path,
    pods_in,
    policy_path,
    service_accounts_in,
    slice_path,
)
from gpuslice.dra.names import MEMORY_WEBHOOK
from gpuslice.dra.quantity import quantity_bytes
from gpuslice.dra.slice_wire import slice_devices, slice_node
from gpuslice.dra.wire import allocation_results, consumed_quantity
from gpuslice.kube.client import KubeError
from gpuslice.planning.node.node_pool import plan_node_pool

FIELD_MANAGER = "gpuslice-bench"
PAUSE = "registry.k8s.io/pause:3.10"


def pod_body(namespace: str, name: str, claim: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
                     "containers": [{"name": "main", "image": PAUSE, "resources": {"claims": [{"name": "gpu"}]}}],
                     "terminationGracePeriodSeconds": 0}}


async def ensure_namespace(cluster: BenchCluster, name: str) -> None:
    with contextlib.suppress(KubeError):
        await cluster.api.create(NAMESPACES, {"metadata": {"name": name}})

    async def has_sa() -> bool:
        return any(sa["metadata"]["name"] == "default"
                   for sa in await cluster.api.list(service_accounts_in(name)))

    await wait_until(has_sa, 60, f"the default ServiceAccount of {name}")


def expected_devices(policies: Sequence[Mapping[str, Any]], node: str, labels: Mapping[str, str],
                     gpus: int = 8) -> int:
    """Devices the planner puts on one node for these (live) policies."""
    parsed = [GpuSlicePolicy.from_body(dict(p)) for p in policies]
    return len(plan_node_pool(labels, FakeBackend(node, [("h100-80gb", gpus)]).discover(), parsed).devices)


async def apply_layout(cluster: BenchCluster, layout: Layout, nodes: Mapping[str, str],
                       labels: Mapping[str, str] | None = None, within: float = 600) -> float:
    """Publish ``layout`` on ``nodes`` (name -> uid); return the seconds until every node had it."""
    started = time.monotonic()
    if layout.whole_gpu:
        await cluster.api.apply(object_path(whole_gpu_class()), whole_gpu_class(), field_manager=FIELD_MANAGER)

        async def one(node: str) -> None:
            body = whole_gpu_slice(node, nodes[node], 8)
            await cluster.api.apply(object_path(body), body, field_manager=FIELD_MANAGER)

        await gather_limited((one(n) for n in nodes), 16)
        return time.monotonic() - started
    for body in layout.policies:
        await cluster.api.create(POLICIES, body)
    names = [p["metadata"]["name"] for p in layout.policies]

    async def ready() -> bool:
        live = [await cluster.api.get(policy_path(n)) for n in names]
        return all(any(c.get("type") == "Ready" and c.get("status") == "True"
                       for c in (p.get("status") or {}).get("conditions") or []) for p in live)

    await wait_until(ready, within, f"policies {', '.join(names)} to be Ready")
    live = [await cluster.api.get(policy_path(n)) for n in names]
    sample = next(iter(nodes))
    per_node = expected_devices(live, sample, {**(labels or {})})
    want = per_node * len(nodes)

    async def published() -> bool:
        slices = await cluster.our_slices()
        return sum(len(slice_devices(s["spec"])) for s in slices if slice_node(s["spec"]) in nodes) == want

    await wait_until(published, within, f"{want} devices of {layout.name} on {len(nodes)} nodes", every=1.0)
    return time.monotonic() - started


async def clear_layout(cluster: BenchCluster, layout: Layout, namespace: str | Sequence[str], nodes: Sequence[str],
                       devices_gone: Callable[[BenchCluster], Awaitable[None]] | None = None) -> None:
    """Pods, claims, policies and their devices go; the nodes stay. Without agents running,
    ``devices_gone`` removes the devices the agents would have removed."""
    for one in ([namespace] if isinstance(namespace, str) else namespace):
        await clear_namespace(cluster, one)
    await _clear_policies(cluster, layout, nodes, devices_gone)


async def clear_namespace(cluster: BenchCluster, namespace: str) -> None:
    api = cluster.api
    with contextlib.suppress(KubeError):
        await api.delete(pods_in(namespace), gracePeriodSeconds=0)
    with contextlib.suppress(KubeError):
        await api.delete(claims_in(namespace))

    claims = claims_in(namespace)

    async def release(name: str) -> None:
        with contextlib.suppress(KubeError):
            await api.merge_patch(claim_path(namespace, name), {"metadata": {"finalizers": None}})

    # The claims' delete-protection finalizer is the resourceclaim controller's to remove once
    # no pod uses a claim; at its client's default 20 requests/s that takes minutes for thousands
    # of claims. The pods are gone, so the bench removes it itself (cleaning up, not measuring).
    await gather_limited((release(c["metadata"]["name"]) for c in await api.list(claims)), 16)

    async def claims_gone() -> bool:
        return not await api.list(claims, limit=1)

    await wait_until(claims_gone, 600, f"the claims in {namespace} to be deleted")


async def _clear_policies(cluster: BenchCluster, layout: Layout, nodes: Sequence[str],
                          devices_gone: Callable[[BenchCluster], Awaitable[None]] | None) -> None:
    api = cluster.api
    if layout.whole_gpu:
        for node in nodes:
            with contextlib.suppress(KubeError):
                await api.delete(slice_path(f"bench-whole-{node}"))
        with contextlib.suppress(KubeError):
            await api.delete(device_class_path(WHOLE_CLASS))
        return
    for body in layout.policies:
        with contextlib.suppress(KubeError):
            await api.delete(policy_path(body["metadata"]["name"]))

    async def gone() -> bool:
        # A deleted policy goes only once no slice publishes its devices: without agents, the bench
        # removes them itself (the policies are deleting, so nothing publishes them again).
        if devices_gone is not None:
            await devices_gone(cluster)
        if await api.list(POLICIES, limit=1):
            return False
        return not [s for s in await cluster.our_slices() if slice_devices(s["spec"])]

    await wait_until(gone, 600, f"the policies and devices of {layout.name} to go", every=1.0)


@dataclass(frozen=True)
class Placement:
    pods: int
    bound: int
    unschedulable: int
    scheduler_cpu: float  # seconds of kube-scheduler CPU while placing
    create_seconds: float  # creating the pods
    bind_seconds: float  # from the first pod created to the last one bound or given up
    allocations: Mapping[str, tuple[str, int]]  # claim -> (request chosen, consumed bytes if capacity)
    refused: int = 0  # pods the maxMemory webhook refused (counted in unschedulable too)


async def create_claims(cluster: BenchCluster, claims: Sequence[dict[str, Any]], concurrency: int = 8) -> None:
    """Create the claims once the tenancy admission policy admits them (it reads the policies'
    status, which the apiserver's admission sees a moment after the controller wrote it)."""
    if not claims:
        return
    first = claims[0]
    collection = claims_in(first["metadata"]["namespace"])

    said: list[str] = []

    async def admitted() -> bool:
        try:
            await cluster.api.request("POST", collection, first, query={"dryRun": "All"})
        except KubeError as error:
            said[:] = [error.message]
            raise
        return True

    try:
        await wait_until(admitted, 120, f"the tenancy admission policy to admit claims in {collection}")
    except BenchError as error:
        raise BenchError(f"{error}; the API server said: {said[0] if said else 'nothing'}") from None
    async def one(body: dict[str, Any]) -> None:
        await create(cluster.api, claims_in(body["metadata"]["namespace"]), body)
    await gather_limited((one(c) for c in claims), concurrency)


async def place_pods(cluster: BenchCluster, namespace: str, claims: Sequence[str], concurrency: int,
                     within: float = 1800) -> Placement:
    """One pod per claim (created ``concurrency`` at a time, in order); wait until each is bound or
    the scheduler found it unschedulable; the scheduler's CPU time over that span."""
    return await place_pods_across(cluster, [(namespace, c) for c in claims], concurrency, within)


def _refused_its_budget(pod: Mapping[str, Any]) -> bool:
    """The maxMemory webhook refused the pod's allocation: its namespace's budget is spent (nothing is
    released during a placement, so it stays refused)."""
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False"
               and MEMORY_WEBHOOK in str(c.get("message")) and "maxMemory" in str(c.get("message"))
               for c in (pod.get("status") or {}).get("conditions") or [])


async def place_pods_across(cluster: BenchCluster, claims: Sequence[tuple[str, str]], concurrency: int,
                            within: float = 1800) -> Placement:
    """``place_pods`` over (namespace, claim) pairs, in order: a pod the maxMemory webhook refused
    (its tenant's budget spent) counts as settled, as an unschedulable one does."""
    scheduler = cluster.pid("kube-scheduler")
    api = cluster.api
    namespaces = sorted({ns for ns, _ in claims})
    cpu0 = _cpu(scheduler)
    started = time.monotonic()

    async def one(index: int, namespace: str, claim: str) -> None:
        await create(api, pods_in(namespace), pod_body(namespace, f"pod-{index:05d}", claim))

    await gather_limited((one(i, ns, c) for i, (ns, c) in enumerate(claims)), concurrency)
    created = time.monotonic() - started
    counts: dict[str, int] = {}

    async def settled() -> bool:
        bound = unschedulable = refused = 0
        for namespace in namespaces:
            for pod in await api.list(pods_in(namespace)):
                if pod["spec"].get("nodeName"):
                    bound += 1
                elif any(c.get("type") == "PodScheduled" and c.get("status") == "False"
                         and c.get("reason") == "Unschedulable"
                         for c in (pod.get("status") or {}).get("conditions") or []):
                    unschedulable += 1
                elif _refused_its_budget(pod):
                    refused += 1
        counts.update(bound=bound, unschedulable=unschedulable + refused, refused=refused)
        return bound + unschedulable + refused == len(claims)

    await wait_until(settled, within, f"{len(claims)} pods in {', '.join(namespaces)} to be bound, unschedulable"
                     " or refused their budget", every=0.5)
    bind_seconds = time.monotonic() - started
    cpu = _cpu(scheduler) - cpu0
    allocations: dict[str, tuple[str, int]] = {}
    for namespace in namespaces:
        for claim in await api.list(claims_in(namespace)):
            results = allocation_results(claim, driver=None)
            if results:
                consumed = consumed_quantity(results[0]) or "0"
                allocations[claim["metadata"]["name"]] = (results[0]["request"], quantity_bytes(consumed))
    return Placement(len(claims), counts["bound"], counts["unschedulable"], cpu, created, bind_seconds, allocations,
                     counts["refused"])


def _cpu(pid: int) -> float:
    try:
        return cpu_seconds(pid)
    except OSError as error:
        raise BenchError(f"cannot read kube-scheduler's CPU time (pid {pid}): {error}") from error


