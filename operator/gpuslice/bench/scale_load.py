"""What the scale figure puts on the fleet once it has converged: pods the scheduler turns away (a
steady state with pending pods), pods bound at a stated churn (what a bound pod costs the agents'
watches), and more tenants on every policy (the steady state again, to show it does not grow)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping, Sequence
from typing import Any

from gpuslice.bench.harness import BenchCluster, create, gather_limited, retry, wait_until
from gpuslice.bench.workload import create_claims, place_pods_across
from gpuslice.coordinates import NAMESPACES, POLICIES, claim_path, pod_path, pods_in, policy_path
from gpuslice.dra.policy_wire import raw_tenants
from gpuslice.kube.client import KubeError
from gpuslice.planning.reads.retry import turned_away

# A selector no device of a policy matches: the scheduler turns the pod away for good ("cannot
# allocate all claims"), and gpuslice's retry, which does not judge selectors, leaves it be.
NEVER = "device.attributes['gpuslice.dev'].index == 999"


def claim(namespace: str, name: str, device_class: str, selector: str | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}


async def _claims(cluster: BenchCluster, bodies: Sequence[dict[str, Any]]) -> None:
    """Made namespace by namespace, each once its tenancy rule admits them."""
    by_namespace: dict[str, list[dict[str, Any]]] = {}
    for body in bodies:
        by_namespace.setdefault(body["metadata"]["namespace"], []).append(body)
    for found in by_namespace.values():
        await create_claims(cluster, found)


def spread(places: Sequence[tuple[str, str]], count: int) -> list[tuple[str, str]]:
    """``count`` (namespace, DeviceClass) picks, round robin over ``places``."""
    return [places[i % len(places)] for i in range(count)]


async def pending_pods(cluster: BenchCluster, places: Sequence[tuple[str, str]], count: int) -> list[tuple[str, str]]:
    """``count`` pods, each with a claim that no device matches; returns them once every one was
    turned away. (namespace, name) of each."""
    picks = spread(places, count)
    await _claims(cluster, [claim(ns, f"pending-{i:04d}", klass, NEVER) for i, (ns, klass) in enumerate(picks)])
    pods = [(ns, f"pending-{i:04d}") for i, (ns, _) in enumerate(picks)]

    async def one(namespace: str, name: str) -> None:
        await create(cluster.api, pods_in(namespace), {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                     "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"claims": [{"name": "gpu"}]}}],
                     "terminationGracePeriodSeconds": 0}})

    await gather_limited((one(ns, name) for ns, name in pods), 8)

    async def away() -> bool:
        found = [await cluster.api.get(pod_path(ns, name)) for ns, name in pods]
        return all(turned_away(p) for p in found)

    await wait_until(away, 300, f"{count} pods to be turned away by the scheduler", every=2.0)
    return pods


async def remove(cluster: BenchCluster, pods: Sequence[tuple[str, str]]) -> None:
    """The pods and their claims of the same name (a bound pod's claim is released with it)."""
    async def one(namespace: str, name: str, claim_name: str) -> None:
        with contextlib.suppress(KubeError):
            await cluster.api.delete(pod_path(namespace, name), gracePeriodSeconds=0)
        with contextlib.suppress(KubeError):
            await cluster.api.delete(claim_path(namespace, claim_name))

    await gather_limited((one(ns, name, name.replace("pod-", "bound-", 1)) for ns, name in pods), 8)


async def bind_pods(cluster: BenchCluster, places: Sequence[tuple[str, str]], count: int) -> dict[str, Any]:
    """``count`` pods, each with its own claim of one device, created 8 at a time, and bound by the
    scheduler; how long that took and how many were bound."""
    picks = spread(places, count)
    names = [(ns, f"bound-{i:05d}") for i, (ns, _) in enumerate(picks)]
    await _claims(cluster, [claim(ns, name, klass) for (ns, name), (_, klass) in zip(names, picks, strict=True)])
    placed = await place_pods_across(cluster, names, 8, within=600)
    return {"pods": placed.pods, "bound": placed.bound, "bind_seconds": round(placed.bind_seconds, 1)}


async def bound_pods(cluster: BenchCluster, namespaces: Sequence[str]) -> list[tuple[str, str]]:
    """The pods ``bind_pods`` made (place_pods_across names them pod-NNNNN)."""
    found = []
    for namespace in sorted(set(namespaces)):
        for pod in await cluster.api.list(pods_in(namespace)):
            if pod["metadata"]["name"].startswith("pod-"):
                found.append((namespace, pod["metadata"]["name"]))
    return found


async def add_tenants(cluster: BenchCluster, bodies: Sequence[dict[str, Any]],
                      extra: Mapping[str, Sequence[str]]) -> float:
    """Each policy named in ``extra`` gains those tenant namespaces (made first); seconds until
    every policy judged its new generation."""
    started = time.monotonic()
    await gather_limited((create(cluster.api, NAMESPACES, {"metadata": {"name": n}})
                          for names in extra.values() for n in names), 16)
    for body in bodies:
        name = body["metadata"]["name"]
        added = [{"namespace": n} for n in extra.get(name, ())]
        if not added:
            continue
        path = policy_path(name)

        async def get(path: str = path) -> dict[str, Any]:
            return await cluster.api.get(path)

        live = await retry(get)
        tenants = [*raw_tenants(live), *({**raw_tenants(body)[0], **t} for t in added)]

        async def edit(path: str = path, tenants: list[dict[str, Any]] = tenants) -> dict[str, Any]:
            return await cluster.api.merge_patch(path, {"spec": {"tenants": tenants}})

        await retry(edit)

    async def judged() -> bool:
        live = await cluster.api.list(POLICIES)
        return all((p.get("status") or {}).get("observedGeneration") == p["metadata"]["generation"]
                   and any(c.get("type") == "Ready" and c.get("status") == "True"
                           for c in (p.get("status") or {}).get("conditions") or []) for p in live)

    await wait_until(judged, 600, "every policy to judge its new tenants", every=2.0)
    await asyncio.sleep(0)
    return time.monotonic() - started
