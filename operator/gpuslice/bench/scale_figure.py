"""Figure 3: gpuslice's own processes at fleet scale: a controller, an agent per node (the
fleet harness), many policies and tenants. gpuslice's requests come from the API server's audit
log (bench.api_cost: reads included, by who asked), every client's from its own
``apiserver_request_total``, the watch traffic from its watch metrics; peak memory from /proc
(VmHWM). Once converged, the steady state is measured without pending pods, with pods the
scheduler turned away, and with twice the tenants; and pods are bound to count what each costs
the agents' watches."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from gpuslice.api.agent_view import VIEWS
from gpuslice.bench.api_cost import AGENT, CONTROLLER, Cost, Window, summary, watched_by
from gpuslice.bench.fleet import start_fleet
from gpuslice.bench.harness import (
    WRITE_VERBS,
    BenchCluster,
    BenchError,
    cpu_seconds,
    create,
    gather_limited,
    peak_rss_mib,
    retry,
    rss_mib,
    wait_until,
)
from gpuslice.bench.layouts import policy
from gpuslice.bench.scale_load import add_tenants, bind_pods, bound_pods, pending_pods, remove
from gpuslice.bench.workload import expected_devices
from gpuslice.coordinates import NAMESPACES, POLICIES, device_taint_rules, policy_path
from gpuslice.dra.policy_wire import raw_tenants, tenant_namespaces
from gpuslice.dra.slice_wire import slice_devices
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
# What of a policy reaches the agents' watches: the policies themselves (before), their agent views.
POLICY_KINDS = ("gpuslicepolicies", "gpusliceagentviews")
POLICY_PATHS = {"gpuslicepolicies": POLICIES, "gpusliceagentviews": VIEWS}
STATUS_INTERVAL = 10.0  # the controller's --status-interval: a bound pod's status refresh comes within it


def scale_policy(index: int, namespaces: list[str]) -> dict[str, Any]:
    """Every fifth policy shared, every fifth dynamic MIG, the rest 10G memory slices; each on its own pool."""
    slicing: dict[str, Any] = {"mode": "memory", "sliceSize": "10G"}
    if index % 5 == 0:
        slicing = {"mode": "shared", "sliceSize": "10G"}
    elif index % 5 == 1:
        slicing = {"mode": "mig", "mig": {"profiles": ["1g.10gb", "3g.40gb"]}}
    body = policy(f"scale-{index:03d}", slicing, namespaces)
    body["spec"]["nodeSelector"] = {"matchLabels": {POOL_LABEL: f"pool-{index:03d}"}}
    mig = slicing["mode"] == "mig"  # each tenant limited, so each gets its quotas
    body["spec"]["tenants"] = [{**t, **({"maxMigDevices": {"1g.10gb": 16, "3g.40gb": 4}} if mig else {"maxSlices": 16})}
                               for t in raw_tenants(body)]
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
        await create(cluster.api, NAMESPACES, {"metadata": {"name": name}})

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
        window = await Window(cluster).open()
        controller_cpu0, harness_cpu1 = cpu_seconds(controller), _own_cpu()
        # Where the controller's memory goes: its resident size and its peak so far, at each phase's end.
        memory = {"fleet started": (rss_mib(controller), peak_rss_mib(controller))}
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
                    for d in slice_devices(s["spec"]):
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
        ours = await window.close()
        memory["converged"] = (rss_mib(controller), peak_rss_mib(controller))
        each_node = round(len(ours.requests) / (nodes + 1), 1)
        say(f"scale: converged in {converge_seconds:.1f} s with {sum(converge.values())} API requests, gpuslice's"
            f" {len(ours.requests)} ({each_node} per node); the controller's RSS {memory['converged'][0]:.0f} MiB,"
            f" its peak {memory['converged'][1]:.0f} MiB ({memory['fleet started'][1]:.0f} before the policies)")
        result.update({
            "converge_requests_gpuslice": len(ours.requests),
            "converge_requests_per_node": each_node,
            "converge_gpuslice_by_who": {who: len(ours.of(who)) for who in (CONTROLLER, AGENT)},
            "converge_gpuslice_by_verb_and_resource": dict(list(ours.by_key().items())[:16]),
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
        window = await Window(cluster).open()
        controller_cpu2, harness_cpu3 = cpu_seconds(controller), _own_cpu()
        await asyncio.sleep(steady_seconds)
        steady = _delta(await retry(cluster.request_totals), steady0)
        controller_cpu3, harness_cpu4 = cpu_seconds(controller), _own_cpu()
        events = await retry(cluster.our_events) - events0
        quiet = await window.close()
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
            "controller_rss_mib_by_phase": {phase: {"rss": round(now, 1), "peak": round(peak, 1)}
                                            for phase, (now, peak) in {
                                                **memory, "steady": (rss_mib(controller), peak_rss_mib(controller)),
                                            }.items()},
            "agent_peak_rss_mib": round(peak_rss_mib(real.pid), 1),
            "controller_cpu_steady_s": round(controller_cpu3 - controller_cpu2, 2),
            "agents_cpu_steady_s": round(harness_cpu4 - harness_cpu3, 2),
            "steady": summary(quiet),
        })
        say(f"scale: steady state, nothing pending: {quiet.total_per_minute()} gpuslice requests a minute"
            f" ({quiet.total_per_minute(CONTROLLER)} the controller's): {quiet.per_minute()}")
        places = [(ns, f"{b['metadata']['name']}.gpuslice.dev") for b in bodies
                  if b["spec"]["slicing"]["mode"] == "memory" for ns in tenant_namespaces(b)]
        result.update(await _pending(cluster, places, max(10, policies), steady_seconds, tenants, say))
        result.update(await _bound(cluster, places, max(20, nodes // 10), nodes + 1, say))
        result.update(await _more_tenants(cluster, bodies, quiet, per_policy, steady_seconds, tenants, say))
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
    await cluster.api.create(NAMESPACES, {"metadata": {"name": extra}})
    before = await cluster.request_totals()
    started = time.monotonic()
    for body in bodies:
        live = await retry(_getter(cluster, policy_path(body["metadata"]["name"])))
        tenants = [*raw_tenants(live), {"namespace": extra}]
        path, patch = policy_path(body["metadata"]["name"]), {"spec": {"tenants": tenants}}

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
    await cluster.api.merge_patch(policy_path(name), {"spec": {"taints": [taint]}})

    async def tainted() -> int | None:
        rules = await cluster.api.list(device_taint_rules(),
                                       labelSelector=f"gpuslice.dev/policy={name}")
        on_devices = sum(1 for s in await cluster.our_slices() for d in slice_devices(s["spec"])
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


async def _pending(cluster: BenchCluster, places: list[tuple[str, str]], count: int, seconds: float,
                   tenants: list[str], say: Callable[[str], None]) -> dict[str, Any]:
    """The steady state with ``count`` pods the scheduler turned away (a claim no device matches):
    the controller sees them in its watch of pods not yet on a node, and reads nothing per namespace."""
    pods = await pending_pods(cluster, places, count)
    await asyncio.sleep(2 * STATUS_INTERVAL)  # the scheduler retry's first look at them, and its judgement
    cost = await _window(cluster, seconds)
    await remove(cluster, pods)
    say(f"scale: steady state with {count} pods turned away: {cost.total_per_minute()} gpuslice requests a minute:"
        f" {cost.per_minute()}")
    return {"steady_pending": {**summary(cost), "pods_pending": count},
            "steady_pending_tenant_namespace_requests": sum(cost.namespaces()[n] for n in tenants)}


async def _window(cluster: BenchCluster, seconds: float) -> Cost:
    window = await Window(cluster).open()
    await asyncio.sleep(seconds)
    return await window.close()


async def _bound(cluster: BenchCluster, places: list[tuple[str, str]], count: int, agents: int,
                 say: Callable[[str], None]) -> dict[str, Any]:
    """``count`` pods bound (created 8 at a time, each with a claim of one 10G slice), and the status
    refreshes that follow: what of the policies' kinds the agents watch was written meanwhile (the
    audit log), each write one watch event to every agent, of the object's size (as the API server
    serves it now). The API server's own watch counters are reported beside: they count every
    watcher's events, bookmarks included, which a bound pod does not cause."""
    window = await Window(cluster).open()
    churn = await bind_pods(cluster, places, count)
    await asyncio.sleep(STATUS_INTERVAL + 5)  # the controller's status refresh of every policy concerned
    cost = await window.close()
    sizes = {kind: await _mean_size(cluster, path) for kind, path in POLICY_PATHS.items()}
    await remove(cluster, await bound_pods(cluster, [ns for ns, _ in places]))
    watched = watched_by(cluster.dev.audit.since(0), AGENT)
    kinds = [k for k in POLICY_KINDS if k in watched]
    writes = {k: sum(1 for r in cost.requests if r.resource.split("/")[0] == k and not r.dry_run
                     and r.verb in ("create", "update", "patch", "delete")) for k in POLICY_KINDS}
    bound = max(1, int(churn["bound"]))
    events = sum(writes[k] for k in kinds)
    per_agent = round(sum(writes[k] * sizes[k] for k in kinds) / bound, 2)
    say(f"scale: {churn['bound']} pods bound in {churn['bind_seconds']} s: writes of the policies' kinds {writes};"
        f" the agents watch {', '.join(kinds) or 'none of them'}: {events / bound:.2f} watch events and {per_agent}"
        f" bytes per agent per bound pod (the API server's counters, every watcher and bookmark: events"
        f" {dict(cost.watch_events & _kinds())}, bytes {dict(cost.watch_bytes & _kinds())})")
    return {"churn": {**churn, "created": "8 at a time, each with its own claim of one 10G slice"},
            "agent_watched_policy_kinds": kinds,
            "churn_policy_kind_writes": writes,
            "policy_watch_events_per_agent_per_pod": round(events / bound, 3),
            "policy_watch_bytes_per_agent_per_pod": per_agent,
            "churn_watch_events_all_watchers": {k: cost.watch_events[k] for k in POLICY_KINDS},
            "churn_watch_bytes_all_watchers": {k: cost.watch_bytes[k] for k in POLICY_KINDS}}


def _kinds() -> Counter[str]:
    """A mask of the policies' kinds (``counter & _kinds()`` keeps their counts)."""
    return Counter({k: 10**18 for k in POLICY_KINDS})


async def _mean_size(cluster: BenchCluster, path: str) -> float:
    """The mean size in bytes of the objects at ``path``, as the API server serves them (JSON)."""
    items = await retry(_lister(cluster, path))
    return sum(len(json.dumps(i, separators=(",", ":"))) for i in items) / len(items) if items else 0.0


def _lister(cluster: BenchCluster, path: str) -> Callable[[], Awaitable[list[dict[str, Any]]]]:
    async def listed() -> list[dict[str, Any]]:
        return await cluster.api.list(path)

    return listed


async def _more_tenants(cluster: BenchCluster, bodies: list[dict[str, Any]], before: Cost, per_policy: int,
                        seconds: float, tenants: list[str], say: Callable[[str], None]) -> dict[str, Any]:
    """Every policy gets as many tenants again: the steady state, measured again, is the same."""
    extra = {b["metadata"]["name"]: [f"bench-t2-{i:03d}-{j:02d}" for j in range(per_policy)]
             for i, b in enumerate(bodies)}
    took = await add_tenants(cluster, bodies, extra)
    await asyncio.sleep(15)  # the converges' last writes, and the status refreshes
    after = await _window(cluster, seconds)
    named = [*tenants, *(n for names in extra.values() for n in names)]
    ratio = round(after.total_per_minute() / before.total_per_minute(), 2) if before.total_per_minute() else None
    say(f"scale: twice the tenants ({len(named)}): {after.total_per_minute()} gpuslice requests a minute in steady"
        f" state, {ratio}x; {after.per_minute()}")
    return {"steady_more_tenants": {**summary(after), "tenants": len(named), "converge_seconds": round(took, 1)},
            "steady_tenants_ratio": ratio,
            "steady_tenant_namespace_requests": sum(after.namespaces()[n] for n in named)}


def _getter(cluster: BenchCluster, path: str) -> Callable[[], Awaitable[dict[str, Any]]]:
    async def get() -> dict[str, Any]:
        return await cluster.api.get(path)

    return get


def _own_cpu() -> float:
    times = os.times()
    return times.user + times.system
