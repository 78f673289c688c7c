"""Figure 3: gpuslice's own processes at fleet scale: a controller, an agent per node (the
fleet harness), many policies and tenants. Counts come from the apiserver's own
``apiserver_request_total``; peak memory from /proc (VmHWM)."""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from gpuslice.bench.fleet import start_fleet
from gpuslice.bench.harness import (
    POLICIES,
    WRITE_VERBS,
    BenchCluster,
    BenchError,
    cpu_seconds,
    create,
    gather_limited,
    peak_rss_mib,
    retry,
    wait_until,
)
from gpuslice.bench.layouts import policy
from gpuslice.bench.workload import expected_devices
from gpuslice.dra.wire import device_policy

POOL_LABEL = "gpuslice.dev/pool"
# What gpuslice writes (the controller and the agents): a write to any of these in steady state is
# ours. Its Events are counted apart (BenchCluster.our_events): everyone writes Events.
OURS = frozenset({
    "resourceslices", "gpuslicepolicies", "gpuslicepolicies/status", "deviceclasses", "resourceclaimtemplates",
    "resourcequotas", "validatingadmissionpolicies", "validatingadmissionpolicybindings", "devicetaintrules",
    "namespaces",
})
REAL_AGENT_NODE = "bench-scale-real"


def scale_policy(index: int, namespaces: list[str]) -> dict[str, Any]:
    """Every fifth policy shared, every fifth dynamic MIG, the rest 10G memory slices; each on its own pool."""
    slicing: dict[str, Any] = {"mode": "memory", "sliceSize": "10G"}
    if index % 5 == 0:
        slicing = {"mode": "shared", "sliceSize": "10G"}
    elif index % 5 == 1:
        slicing = {"mode": "mig", "mig": {"profiles": ["1g.10gb", "3g.40gb"]}}
    body = policy(f"scale-{index:03d}", slicing, namespaces)
    body["spec"]["nodeSelector"] = {"matchLabels": {POOL_LABEL: f"pool-{index:03d}"}}
    for tenant in body["spec"]["tenants"]:  # each tenant limited, so each gets its quotas
        if slicing["mode"] == "mig":
            tenant["maxMigDevices"] = {"1g.10gb": 16, "3g.40gb": 4}
        else:
            tenant["maxSlices"] = 16
    return body


def _delta(after: Counter[tuple[str, str]], before: Counter[tuple[str, str]]) -> Counter[tuple[str, str]]:
    return Counter({k: after[k] - before.get(k, 0) for k in after if after[k] - before.get(k, 0) > 0})


def _by_resource(counts: Counter[tuple[str, str]]) -> dict[str, int]:
    return {f"{verb} {resource}": n for (verb, resource), n in sorted(counts.items(), key=lambda kv: -kv[1])}


def _writes(counts: Counter[tuple[str, str]], ours_only: bool) -> int:
    return sum(n for (verb, resource), n in counts.items()
               if verb in WRITE_VERBS and (not ours_only or resource in OURS))


async def scale_figure(cluster: BenchCluster, nodes: int, policies: int, namespaces: int, steady_seconds: float,
                       say: Callable[[str], None]) -> dict[str, Any]:
    names = [f"bench-scale-{i:04d}" for i in range(1, nodes + 1)]
    pool_of = {n: f"pool-{i % policies:03d}" for i, n in enumerate(names)}
    say(f"scale: {nodes} nodes, {policies} policies, {namespaces} namespaces")
    await cluster.create_nodes(names, {n: {POOL_LABEL: p} for n, p in pool_of.items()}, concurrency=32)
    await cluster.create_nodes([REAL_AGENT_NODE], {REAL_AGENT_NODE: {POOL_LABEL: "pool-000"}})
    tenants = [f"bench-t-{i:03d}" for i in range(namespaces)]

    async def make_ns(name: str) -> None:
        await create(cluster.api, "/api/v1/namespaces", {"metadata": {"name": name}})

    await gather_limited((make_ns(n) for n in tenants), 16)
    say(f"scale: {nodes} nodes and {namespaces} namespaces made; making each agent's node-bound identity")
    kubeconfigs = {}
    for n in names:
        kubeconfigs[n] = await cluster.agent_kubeconfig(n)
    say(f"scale: starting {nodes} agents in this process and one real agent process")
    result: dict[str, Any] = {
        "nodes": nodes, "gpus_per_node": 8, "policies": policies, "namespaces": namespaces,
        "harness": f"{nodes} agents' loops in one process (own clients, tokens and watches), plus one real"
                   " agent process on one more node",
    }
    harness_cpu0 = _own_cpu()
    fleet = await start_fleet(kubeconfigs)
    try:
        real = await cluster.start_agent(REAL_AGENT_NODE)
        await asyncio.sleep(5)  # the agents' first (empty) cycles
        per_policy = max(1, namespaces // policies)
        bodies = [scale_policy(i, tenants[(i * per_policy) % namespaces:][:per_policy] or tenants[:1])
                  for i in range(policies)]
        controller = cluster.controller.pid if cluster.controller else None
        if controller is None:
            raise BenchError("the controller is not running")
        before = await retry(cluster.request_totals)
        controller_cpu0, harness_cpu1 = cpu_seconds(controller), _own_cpu()
        say(f"scale: applying {policies} policies")
        started = time.monotonic()
        await gather_limited((create(cluster.api, POLICIES, b) for b in bodies), 8)
        want = {}
        for i, body in enumerate(bodies):
            pool = f"pool-{i:03d}"
            members = [n for n, p in pool_of.items() if p == pool] + ([REAL_AGENT_NODE] if i == 0 else [])
            live = body | {"metadata": {**body["metadata"], "creationTimestamp": "2026-01-01T00:00:00Z",
                                        "generation": 1}}
            per_node = expected_devices([live], members[0], {POOL_LABEL: pool}) if members else 0
            want[body["metadata"]["name"]] = per_node * len(members)
        result["devices"] = sum(want.values())

        last_said = time.monotonic()

        async def converged() -> bool:
            nonlocal last_said
            live = await cluster.api.list(POLICIES)
            ready = sum(any(c.get("type") == "Ready" and c.get("status") == "True"
                            for c in (p.get("status") or {}).get("conditions") or []) for p in live)
            counts: Counter[str] = Counter()
            if ready == len(bodies) or time.monotonic() - last_said > 60:
                for s in await cluster.our_slices():
                    for d in s["spec"].get("devices") or []:
                        counts[str(device_policy(d))] += 1
            if time.monotonic() - last_said > 60:
                last_said = time.monotonic()
                say(f"scale: {ready} of {len(bodies)} policies Ready, {sum(counts.values())} of"
                    f" {sum(want.values())} devices published")
            return ready == len(bodies) and all(counts[name] == n for name, n in want.items())

        await wait_until(converged, 3600, "every pool published and every policy Ready", every=2.0)
        converge_seconds = time.monotonic() - started
        after = await retry(cluster.request_totals)
        controller_cpu1, harness_cpu2 = cpu_seconds(controller), _own_cpu()
        converge = _delta(after, before)
        say(f"scale: converged in {converge_seconds:.1f} s with {sum(converge.values())} API requests")
        result.update({
            "converge_seconds": round(converge_seconds, 1),
            "converge_requests": sum(converge.values()),
            "converge_writes": _writes(converge, True),
            "converge_by_resource": dict(list(_by_resource(converge).items())[:12]),
            "controller_cpu_converge_s": round(controller_cpu1 - controller_cpu0, 2),
            "agents_cpu_converge_s": round(harness_cpu2 - harness_cpu1, 2),
        })
        await asyncio.sleep(15)  # past debounce, drains and the controller's first status refresh
        events0 = await retry(cluster.our_events)
        steady0 = await retry(cluster.request_totals)
        controller_cpu2, harness_cpu3 = cpu_seconds(controller), _own_cpu()
        await asyncio.sleep(steady_seconds)
        steady = _delta(await retry(cluster.request_totals), steady0)
        controller_cpu3, harness_cpu4 = cpu_seconds(controller), _own_cpu()
        events = await retry(cluster.our_events) - events0
        writes = {k: n for k, n in _by_resource(steady).items() if k.split()[0] in WRITE_VERBS}
        say(f"scale: {steady_seconds:.0f} s of steady state, {_writes(steady, True) + events} writes by gpuslice"
            f" ({events} Events); every write the apiserver counted, anyone's: {writes or 'none'}")
        if real.pid is None:
            raise BenchError("the real agent is not running")
        result.update({
            "steady_seconds": steady_seconds,
            "steady_requests": sum(steady.values()),
            "steady_writes": _writes(steady, True) + events,
            "steady_events_by_gpuslice": events,
            "steady_writes_all": _writes(steady, False),
            "steady_by_resource": _by_resource(steady),
            "controller_peak_rss_mib": round(peak_rss_mib(controller), 1),
            "agent_peak_rss_mib": round(peak_rss_mib(real.pid), 1),
            "controller_cpu_steady_s": round(controller_cpu3 - controller_cpu2, 2),
            "agents_cpu_steady_s": round(harness_cpu4 - harness_cpu3, 2),
        })
        result.update(await _edit_every_policy(cluster, bodies, say))
        result.update(await _taint_one_policy(cluster, bodies, want, say))
        result["harness_cpu_s"] = round(_own_cpu() - harness_cpu0, 1)
    except Exception as error:
        raise cluster.failed(result, error) from error
    finally:
        await fleet.close()
        await cluster.stop_agents()
    return result


async def _edit_every_policy(cluster: BenchCluster, bodies: list[dict[str, Any]],
                             say: Callable[[str], None]) -> dict[str, Any]:
    """Every policy gains a tenant (no device changes): what a policy edit costs the fleet's reads."""
    extra = "bench-t-extra"
    await cluster.api.create("/api/v1/namespaces", {"metadata": {"name": extra}})
    before = await cluster.request_totals()
    started = time.monotonic()
    for body in bodies:
        tenants = [*body["spec"]["tenants"], {"namespace": extra}]
        path, patch = f"{POLICIES}/{body['metadata']['name']}", {"spec": {"tenants": tenants}}

        async def edit(path: str = path, patch: dict[str, Any] = patch) -> dict[str, Any]:
            return await cluster.api.merge_patch(path, patch)

        await retry(edit)

    async def judged() -> bool:
        live = await cluster.api.list(POLICIES)
        return all((p.get("status") or {}).get("observedGeneration") == p["metadata"]["generation"] for p in live)

    await wait_until(judged, 600, "every edited policy to be judged")
    await asyncio.sleep(10)  # the agents' jittered wake-ups and their cycles
    counts = _delta(await cluster.request_totals(), before)
    agent_reads = {k: n for k, n in counts.items() if k[0] in ("GET", "LIST")
                   and k[1] in ("nodes", "gpuslicepolicies", "resourceslices", "resourceclaims")}
    say(f"scale: editing {len(bodies)} policies: {sum(counts.values())} requests,"
        f" {sum(agent_reads.values())} agent reads")
    return {"edit_policies": len(bodies), "edit_seconds": round(time.monotonic() - started, 1),
            "edit_requests": sum(counts.values()), "edit_agent_reads": sum(agent_reads.values()),
            "edit_by_resource": dict(list(_by_resource(counts).items())[:10])}


async def _taint_one_policy(cluster: BenchCluster, bodies: list[dict[str, Any]], want: dict[str, int],
                            say: Callable[[str], None]) -> dict[str, Any]:
    """A maintenance taint on one memory policy: how many objects and requests until every one of
    its devices is tainted (on the device, or by a DeviceTaintRule)."""
    name = next(b["metadata"]["name"] for b in bodies if b["spec"]["slicing"]["mode"] == "memory")
    before = await cluster.request_totals()
    started = time.monotonic()
    taint = {"key": "gpuslice.dev/maintenance", "value": "planned", "effect": "NoSchedule"}
    await cluster.api.merge_patch(f"{POLICIES}/{name}", {"spec": {"taints": [taint]}})

    async def tainted() -> int | None:
        rules = await cluster.api.list("/apis/resource.k8s.io/v1/devicetaintrules",
                                       labelSelector=f"gpuslice.dev/policy={name}")
        on_devices = sum(1 for s in await cluster.our_slices() for d in s["spec"].get("devices") or []
                         if device_policy(d) == name
                         and any(t.get("key") == taint["key"] for t in d.get("taints") or []))
        return len(rules) + 1 if max(len(rules), on_devices) >= want[name] else None

    rules = (await wait_until(tainted, 900, f"every device of {name} to be tainted", every=2.0)) - 1
    seconds = time.monotonic() - started
    counts = _delta(await cluster.request_totals(), before)
    say(f"scale: tainting {name} ({want[name]} devices): {seconds:.1f} s, {rules} DeviceTaintRules,"
        f" {_writes(counts, True)} writes")
    return {"taint_devices": want[name], "taint_seconds": round(seconds, 1), "taint_rules": rules,
            "taint_writes": _writes(counts, True), "taint_requests": sum(counts.values())}


def _own_cpu() -> float:
    times = os.times()
    return times.user + times.system
