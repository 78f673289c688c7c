"""Quiet at scale, counted by the API server (its audit log of gpuslice's identities, its watch
metrics), never by gpuslice's own counters:

- with 100 tenant namespaces and nothing pending, the controller's requests a minute are a small
  constant and none names a tenant namespace (it listed the pods of each tenant namespace every
  scheduler-retry interval: 100 lists a minute at 50 tenants, 2,000 with the tests' 3 s interval);
- 50 pods bound on a policy's devices: the policy's status follows, and no agent is sent a watch
  event of it (every agent received every status write of every policy).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from gpuslice.devcluster.audit import Request
from gpuslice.devcluster.cluster import DevCluster
from gpuslice.kube.client import KubeClient
from tests.cluster.gpu_nodes import GpuNodeFactory
from tests.cluster.kubeutil import POLICIES, RESOURCE, wait_for
from tests.cluster.observe import parse, total
from tests.cluster.operator_fixtures import CONTROLLER_USER, ControllerProcess, PolicyFactory

NO_NODES = {"matchLabels": {"gpuslice.dev/test-selects": "nothing"}}
TENANTS = 100  # two policies of 50 (a policy names at most 64)
WINDOW = 65.0  # seconds of steady state counted
# Requests a minute the controller may make in steady state, besides renewing its Lease: Kopf's and
# its own watches coming back (each ends every 10 minutes), the tenancy canary every drift interval,
# the webhook certificates' check. Constant: it is the same at 2 tenants or 2,000.
STEADY_PER_MINUTE = 12
AGENT_USER = "system:serviceaccount:gpuslice-system:gpuslice-agent"
POLICY_KINDS = ("gpuslicepolicies", "gpusliceagentviews")


async def judged(kube: KubeClient, name: str) -> bool:
    body = await kube.get(f"{POLICIES}/{name}")
    status = body.get("status") or {}
    return status.get("observedGeneration") == body["metadata"]["generation"] and any(
        c.get("type") == "Valid" and c.get("status") == "True" for c in status.get("conditions") or [])


def steady(requests: list[Request]) -> list[Request]:
    """The controller's requests but its Lease's renewals (GET and PUT every --retry-period)."""
    return [r for r in requests if r.user == CONTROLLER_USER and r.resource != "leases"]


async def test_a_hundred_tenants_and_nothing_pending_cost_a_small_constant_and_nothing_per_namespace(
    cluster: DevCluster, kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
    namespaces: Callable[..., Awaitable[str]],
) -> None:
    tenants = [await namespaces(f"q{i:03d}") for i in range(TENANTS)]
    names: list[str] = []
    for half in (tenants[:TENANTS // 2], tenants[TENANTS // 2:]):
        body = await make_policy({"nodeSelector": NO_NODES, "slicing": {"mode": "memory", "sliceSize": "10G"},
                                  "tenants": [{"namespace": n} for n in half]}, f"-q{len(names)}")
        names.append(body["metadata"]["name"])
    for name in names:
        async def valid(name: str = name) -> bool:
            return await judged(kube, name)

        await wait_for(valid, within=120, what=f"{name} to be judged valid")
    # Every tenant's claim template made: the converges are over.
    for namespace in tenants:
        async def templated(namespace: str = namespace) -> bool:
            return bool(await kube.list(f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates"))

        await wait_for(templated, within=120, what=f"the claim template of {namespace}")
    await asyncio.sleep(15)  # length: a status interval (10 s) and more: the last converges' status writes

    mark = cluster.audit.mark()
    await asyncio.sleep(WINDOW)  # length: the steady state counted
    seen = cluster.audit.since(mark)
    ours = steady(seen)
    per_minute = len(ours) * 60.0 / WINDOW
    by_what = Counter(r.key for r in ours)
    print(f"the controller, {WINDOW:.0f} s of steady state with {TENANTS} tenant namespaces: {len(ours)} requests"
          f" ({per_minute:.1f} a minute) besides its Lease: {dict(by_what)}")
    named = Counter(f"{r.key} in {r.namespace}" for r in seen if r.user == CONTROLLER_USER and r.namespace in tenants)
    assert not named, f"the controller made requests per tenant namespace in steady state: {dict(named)}"
    assert per_minute <= STEADY_PER_MINUTE, (
        f"the controller made {per_minute:.1f} requests a minute in steady state (at most {STEADY_PER_MINUTE}):"
        f" {dict(by_what)}")
    assert not [r for r in ours if r.verb not in ("get", "list", "watch") and not r.dry_run], (
        "the controller wrote in steady state")


def watch_totals(text: str) -> tuple[Counter[str], Counter[str]]:
    """Events and bytes the API server sent to watchers of each of the policies' kinds, every watcher together."""
    samples = parse(text)
    return (Counter({k: int(total(samples, "apiserver_watch_events_total", resource=k)) for k in POLICY_KINDS}),
            Counter({k: int(total(samples, "apiserver_watch_events_sizes_sum", resource=k)) for k in POLICY_KINDS}))


async def apiserver_watch(kube: KubeClient) -> tuple[Counter[str], Counter[str]]:
    text = await kube.request("GET", "/metrics", accept="text/plain")
    return watch_totals(text if isinstance(text, str) else str(text))


async def view_versions(kube: KubeClient) -> dict[str, str]:
    """Every agent view's resourceVersion, by name."""
    views = await kube.list("/apis/gpuslice.dev/v1alpha1/namespaces/gpuslice-system/gpusliceagentviews")
    return {v["metadata"]["name"]: str(v["metadata"]["resourceVersion"]) for v in views}


def claim(name: str, device_class: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]}}}


def pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                     "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"claims": [{"name": "gpu"}]}}],
                     "terminationGracePeriodSeconds": 0}}


async def test_fifty_pods_bound_send_no_policy_watch_event_to_any_agent(
    cluster: DevCluster, kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
    gpu_node: GpuNodeFactory, namespace: str,
) -> None:
    nodes = [await gpu_node("h100-80gb", 4) for _ in range(2)]
    selector = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                      "values": [n.name for n in nodes]}]}
    body = await make_policy({"nodeSelector": selector, "slicing": {"mode": "memory", "sliceSize": "10G"},
                              "tenants": [{"namespace": namespace}]})
    name = body["metadata"]["name"]
    klass = f"{name}.gpuslice.dev"

    async def published() -> bool:
        found = await kube.list(f"{RESOURCE}/resourceslices", fieldSelector="spec.driver=gpu.gpuslice.dev")
        return sum(len(s["spec"].get("devices") or []) for s in found
                   if s["spec"]["nodeName"] in {n.name for n in nodes}) >= 64

    await wait_for(published, within=90, what="the policy's devices published on both nodes")

    async def admitted() -> bool:
        await kube.request("POST", f"{RESOURCE}/namespaces/{namespace}/resourceclaims", claim("probe", klass),
                           query={"dryRun": "All"})
        return True

    await wait_for(admitted, within=60, what="the tenancy rule to admit the tenant's claims")
    await asyncio.sleep(12)  # length: a status interval (10 s) and more, for the refresh after publishing
    events0, bytes0 = await apiserver_watch(kube)
    views0 = await view_versions(kube)
    mark = cluster.audit.mark()
    for i in range(50):
        await kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaims", claim(f"c-{i:02d}", klass))
        await kube.create(f"/api/v1/namespaces/{namespace}/pods", pod(f"c-{i:02d}"))

    async def bound() -> bool:
        return sum(1 for p in await kube.list(f"/api/v1/namespaces/{namespace}/pods") if p["spec"].get("nodeName")) == 50

    await wait_for(bound, within=120, what="50 pods bound")

    async def counted() -> bool:
        status = (await kube.get(f"{POLICIES}/{name}")).get("status") or {}
        return (status.get("slices") or {}).get("allocated") == 50

    await wait_for(counted, within=60, what="the policy's status to count the 50 allocations")
    await asyncio.sleep(12)  # length: a status interval (10 s) and more, for any later status refresh
    events1, bytes1 = await apiserver_watch(kube)
    views1 = await view_versions(kube)
    requests = cluster.audit.since(0)
    agents = {r.node for r in requests if r.user == AGENT_USER and r.node in {n.name for n in nodes}}
    watched = {r.resource for r in requests if r.user == AGENT_USER and r.verb == "watch"}
    sent = {k: events1[k] - events0[k] for k in POLICY_KINDS}
    sent_bytes = {k: bytes1[k] - bytes0[k] for k in POLICY_KINDS}
    status_writes = sum(1 for r in cluster.audit.since(mark) if r.user == CONTROLLER_USER
                        and r.key == "patch gpuslicepolicies/status")
    print(f"50 pods bound: {status_writes} status writes of the policy; watch events sent of {sent} ({sent_bytes}"
          f" bytes), to every watcher together; the agents ({sorted(agents)}) watch {sorted(watched)}")
    assert agents == {n.name for n in nodes}, "both agents are in the audit log"
    assert sent["gpuslicepolicies"] > 0, "the policy's status changed: its watchers were sent it"
    assert "gpuslicepolicies" not in watched, "the agents watch the policies: every status write reaches them"
    # Of what the agents watch of the policies, their views: none changed, so no event of one was sent
    # to anyone (what the watch metric may count besides are bookmarks, which carry no object).
    changed = {n: (views0.get(n), v) for n, v in views1.items() if views0.get(n) != v}
    assert not changed, f"agent views written while 50 pods were bound (each sent to every agent): {changed}"
    assert sent_bytes["gpusliceagentviews"] <= 10 * 50 * len(agents), "over 10 bytes per agent per bound pod"
