"""Figure 5: fragmentation. A seeded churn of inference pods and whole-GPU pods on 16 fake H100s,
replayed on the real control plane twice: with defragmentation Off, and in Auto mode.

Inference pods are ReplicaSets of one pod (movable), each asking for a 10G or a 20G slice of two
memory policies that share every GPU; whole-GPU pods are bare pods asking for the whole GPU. The
real scheduler places everything, the real controller moves pods in Auto mode, and the agents
publish and taint. No pod runner runs (as in the other figures): a pod counts as placed once its
claim is allocated, and with ``terminationGracePeriodSeconds: 0`` an evicted pod goes at once.

Time is compressed (``ChurnSpec.seconds_per_minute``): Auto's ``minPendingSeconds`` and the
controller's timers are set in real seconds to the trace's scale. Reported: the GPU-hours of
whole-GPU pods waiting while the fleet held enough free memory for them, with each mode; the
evictions Auto made against the fewest that could have freed a GPU at each move (``churn.
fewest_evictions``, computed offline from the fleet as it was when the move began).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from gpuslice.bench.churn import (
    ChurnSpec,
    FleetSample,
    GpuLoad,
    Held,
    blocked_with_room,
    churn_trace,
    fewest_evictions,
    usable,
    waiting_at_all,
    waiting_with_room,
)
from gpuslice.bench.harness import BenchCluster, wait_until
from gpuslice.bench.workload import PAUSE, ensure_namespace
from gpuslice.coordinates import (
    POLICIES,
    SLICES,
    claim_template_path,
    claims_in,
    events_in,
    pods_in,
    policy_path,
    replicasets_in,
)
from gpuslice.dra.names import DRIVER
from gpuslice.dra.quantity import quantity_bytes
from gpuslice.dra.slice_wire import slice_devices, slice_node
from gpuslice.dra.wire import device_policy, is_allocated
from gpuslice.kube.client import KubeError, NotFound
from gpuslice.planning.defrag.model import moves_in_flight
from gpuslice.planning.reads.published import PublishedDevice, gpu_memory, read_pools

NODES = ("bench-frag-1", "bench-frag-2")
NAMESPACE = "bench-frag"
LABEL = {"gpuslice.dev/bench": "fragmentation"}
SIZES = ("10", "20")
MIN_PENDING_MINUTES = 3.0  # Auto waits this long (simulated) before moving pods for a whole-GPU pod


def policy_name(size: str, mode: str) -> str:
    """Each mode's run has policies of its own names (and so devices, classes and templates): the
    Auto run inherits nothing of the Off run's, whatever of it is still going away."""
    return f"bench-frag-{size}g-{mode.lower()}"


def template(kind: str, mode: str) -> str:
    """The claim template of ``kind`` ("10", "20" or "full": the 10G policy's whole-GPU template)."""
    return f"gpu-10g-{mode.lower()}-full" if kind == "full" else f"gpu-{kind}g-{mode.lower()}"


def policy(size: str, mode: str, spec: ChurnSpec) -> dict[str, Any]:
    pending = max(1, round(MIN_PENDING_MINUTES * spec.seconds_per_minute))
    return {"apiVersion": "gpuslice.dev/v1alpha1", "kind": "GpuSlicePolicy",
            "metadata": {"name": policy_name(size, mode)},
            "spec": {"nodeSelector": {"matchLabels": LABEL},
                     "slicing": {"mode": "memory", "sliceSize": f"{size}G", "allowFullGpu": size == "10"},
                     "tenants": [{"namespace": NAMESPACE}], "claimTemplateName": template(size, mode),
                     "defragmentation": {"mode": mode if size == "10" else "Off", "maxEvictionsPerHour": 1000,
                                         "minPendingSeconds": pending}}}


def workload(name: str, kind: str, mode: str) -> tuple[str, dict[str, Any]]:
    """(collection, body): a ReplicaSet of one inference pod, or a bare whole-GPU pod."""
    pod_spec = {"terminationGracePeriodSeconds": 0,
                "containers": [{"name": "main", "image": PAUSE, "resources": {"claims": [{"name": "gpu"}]}}],
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template(kind, mode)}]}
    if kind == "full":
        return pods_in(NAMESPACE), {"apiVersion": "v1", "kind": "Pod",
                                                         "metadata": {"name": name}, "spec": pod_spec}
    return replicasets_in(NAMESPACE), {
        "apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": name},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}}, "spec": pod_spec}}}


def _load(devices: list[PublishedDevice], counter_sets: Mapping[str, Mapping[str, int]]) -> GpuLoad:
    """One GPU for the offline count: its inference pods' devices and its counters."""
    def held(device: PublishedDevice) -> Held:
        counters = dict(device.device.counters)
        return Held(f"{device.device.policy}/{device.device.kind}", _amount(counters.get("memory", "0")),
                    _amount(counters.get("compute", "0")))

    capacity = counter_sets.get(devices[0].device.counter_set or "", {})
    slots = Counter(f"{d.device.policy}/{d.device.kind}" for d in devices)
    return GpuLoad(tuple(held(d) for d in devices if d.allocated and d.device.kind == "slice"),
                   capacity.get("memory", 0), capacity.get("compute", 0), tuple(sorted(slots.items())),
                   open=not any(d.allocated and d.device.kind == "full" for d in devices))


def _amount(text: str) -> int:
    return quantity_bytes(text) if text else 0


class Observer:
    """Samples the fleet while the trace runs: the whole-GPU pods waiting, the empty GPUs, the free
    memory elsewhere, and the moves of the run's 10G policy."""

    def __init__(self, cluster: BenchCluster, minute: Callable[[], float], policy: str) -> None:
        self.api, self.minute, self.policy = cluster.api, minute, policy
        self.fleet: list[FleetSample] = []
        self.moves: dict[str, dict[str, Any]] = {}
        self.before: list[GpuLoad] = []  # the fleet at the sample before this one: what a new move was planned on

    async def sample(self, live_large: set[str]) -> None:
        now = self.minute()
        slices = await self.api.list(SLICES, fieldSelector=f"spec.driver={DRIVER}")
        claims = await self.api.list(claims_in(NAMESPACE))
        pools = read_pools(slices, claims)
        loads, empty, free = [], 0, 0
        for pool in pools:
            by_gpu: dict[str, list[Any]] = {}
            for device in pool.devices:
                by_gpu.setdefault(device.device.gpu_uuid, []).append(device)
            for devices in by_gpu.values():
                memory = gpu_memory(devices, pool.counter_sets)
                held = [d for d in devices if d.allocated]
                if held:
                    free += usable(memory - sum(d.device.memory for d in held))
                else:
                    empty += 1
                loads.append(_load(devices, pool.counter_sets))
        allocated = {str((c["metadata"].get("ownerReferences") or [{}])[0].get("name")) for c in claims
                     if is_allocated(c)}
        self.fleet.append(FleetSample(now, len(live_large - allocated), empty, free))
        policy_body = await self.api.get(policy_path(self.policy))
        last = (((policy_body.get("status") or {}).get("defragmentation") or {}).get("last")) or {}
        if last.get("id") in self.moves:
            self.moves[last["id"]].update(outcome=last.get("outcome"), message=last.get("message"))
        for move in moves_in_flight([policy_body]):
            if move.id not in self.moves:
                self.moves[move.id] = {"evictions_planned": len(move.evictions),
                                       "fewest": fewest_evictions(self.before or loads), "minute": round(now, 1)}
        self.before = loads


def auto_looks(log: str, policy: str) -> dict[str, int]:
    """What Auto's looks found for the run's policy, from the controller's log: its planner's
    verdicts for aged waiting pods, counted (a look with none aged is not logged)."""
    found: Counter[str] = Counter()
    for line in log.splitlines():
        if '"defragmentation looked"' not in line:
            continue
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if entry.get("policy") == policy:
                found.update({str(k): int(v) for k, v in (entry.get("verdicts") or {}).items()})
    return dict(sorted(found.items()))


async def replay(cluster: BenchCluster, spec: ChurnSpec, mode: str, say: Callable[[str], None]) -> dict[str, Any]:
    api = cluster.api
    names = {policy_name(size, mode) for size in SIZES}
    for size in SIZES:
        await api.create(POLICIES, policy(size, mode, spec))

    async def ready() -> bool:
        with contextlib.suppress(KubeError):
            await api.get(claim_template_path(NAMESPACE, template("full", mode)))
            devices = sum(1 for s in await api.list(SLICES, fieldSelector=f"spec.driver={DRIVER}")
                          if slice_node(s["spec"]) in NODES for d in slice_devices(s["spec"])
                          if device_policy(d) in names)
            return devices == len(NODES) * 8 * (8 + 1 + 4)
        return False

    await wait_until(ready, 180, "the fragmentation policies' devices and templates")
    trace = churn_trace(spec)
    steps = sorted([(a.at, 0, "create", a) for a in trace] + [(a.until, 1, "delete", a) for a in trace
                                                            if a.until < spec.minutes],
                   key=lambda s: (s[0], s[1], s[3].name))
    started = time.monotonic()

    def minute() -> float:
        return (time.monotonic() - started) / spec.seconds_per_minute

    observer = Observer(cluster, minute, policy_name("10", mode))
    live_large: set[str] = set()
    stop = asyncio.Event()

    async def sampling() -> None:
        while not stop.is_set():
            with contextlib.suppress(KubeError, OSError):
                await observer.sample(set(live_large))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), spec.seconds_per_minute / 2)

    sampler = asyncio.create_task(sampling())
    try:
        for at, _, action, arrival in steps:
            await asyncio.sleep(max(0.0, at * spec.seconds_per_minute - (time.monotonic() - started)))
            collection, body = workload(arrival.name, arrival.kind, mode)
            with contextlib.suppress(NotFound):
                if action == "create":
                    await api.create(collection, body)
                    if arrival.kind == "full":
                        live_large.add(arrival.name)
                else:
                    await api.delete(f"{collection}/{arrival.name}", propagationPolicy="Background")
                    live_large.discard(arrival.name)
        await asyncio.sleep(max(0.0, spec.minutes * spec.seconds_per_minute - (time.monotonic() - started)))
    finally:
        stop.set()
        await sampler
    fleet = [*observer.fleet, FleetSample(minute(), 0, 0, 0)]
    events = await api.list(events_in(NAMESPACE))
    evictions = sum(int(e.get("count") or 1) for e in events if e.get("reason") == "MovedByGpuslice")
    freed = sum(1 for e in events if e.get("reason") == "DefragmentationFreed")
    failed = sum(1 for e in events if e.get("reason") == "DefragmentationFailed")
    blocked = sorted({str(e.get("message", ""))[:300] for e in events if e.get("reason") == "DefragmentationBlocked"})
    fewest = [m["fewest"] for m in observer.moves.values() if m["fewest"] is not None]
    log = cluster.dev.state.logs / "gpuslice-controller.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    notes = [line[:400] for line in text.splitlines() if "defragmentation" in line and '"warning"' in line][-5:]
    result = {"large_pods": len([a for a in trace if a.kind == "full"]), "inference_pods": len(trace),
              "gpu_hours_waiting_with_room": round(waiting_with_room(fleet) / 60, 3),
              "gpu_hours_waiting": round(waiting_at_all(fleet) / 60, 3),
              "samples_blocked_with_room": sum(1 for s in fleet if blocked_with_room(s)),
              "samples": len(fleet), "auto_looks": auto_looks(text, policy_name("10", mode)),
              "evictions": evictions, "moves": len(observer.moves), "moves_freed": freed, "moves_failed": failed,
              "fewest_evictions": sum(fewest), "move_log": list(observer.moves.values())[:50],
              "controller_warnings": notes, "blocked": blocked[:10]}
    say(f"fragmentation: {mode}: {result['gpu_hours_waiting_with_room']} GPU-hours of whole-GPU pods waiting with"
        f" room (of {result['gpu_hours_waiting']} waiting); {evictions} evictions in {len(observer.moves)} moves"
        f" ({freed} freed a GPU), fewest possible"
        f" {sum(fewest)}")
    await clear(cluster, mode)
    return result


async def clear(cluster: BenchCluster, mode: str) -> None:
    api = cluster.api
    for collection in (replicasets_in(NAMESPACE), pods_in(NAMESPACE)):
        for item in await api.list(collection):
            with contextlib.suppress(NotFound):
                await api.delete(f"{collection}/{item['metadata']['name']}", gracePeriodSeconds=0)
    names = [policy_name(size, mode) for size in SIZES]
    for name in names:
        with contextlib.suppress(NotFound):
            await api.delete(policy_path(name))

    async def empty() -> bool:
        if await api.list(claims_in(NAMESPACE)):
            return False
        return not [p for p in await api.list(POLICIES) if p["metadata"]["name"] in names]

    await wait_until(empty, 180, "the fragmentation figure's pods, claims and policies to go")


async def fragmentation_figure(cluster: BenchCluster, spec: ChurnSpec, say: Callable[[str], None]) -> dict[str, Any]:
    say(f"fragmentation: {spec.minutes:.0f} simulated minutes at {spec.seconds_per_minute} s each, twice")
    await cluster.create_nodes(NODES, labels={n: LABEL for n in NODES})
    await ensure_namespace(cluster, NAMESPACE)
    for node in NODES:
        await cluster.start_agent(node)
    # Timers at the trace's scale: Auto looks every second and gives a move 60 s.
    await cluster.stop_controller()
    await cluster.start_controller("--defrag-interval=1", "--defrag-timeout=120", "--defrag-taint-wait=30")
    runs: dict[str, Any] = {}
    try:
        for mode in ("Off", "Auto"):
            runs[mode.lower()] = await replay(cluster, spec, mode, say)
    except Exception as error:
        raise cluster.failed({"runs": runs}, error) from error
    finally:
        await cluster.stop_controller()
        await cluster.start_controller()
        await cluster.stop_agents()
        await cluster.delete_nodes(NODES)
    off, auto = runs["off"]["gpu_hours_waiting_with_room"], runs["auto"]["gpu_hours_waiting_with_room"]
    fewest = runs["auto"]["fewest_evictions"]
    return {
        "spec": {"gpus": spec.gpus, "minutes": spec.minutes, "seconds_per_minute": spec.seconds_per_minute,
                 "seed": spec.seed, "min_pending_minutes": MIN_PENDING_MINUTES},
        "off": runs["off"], "auto": runs["auto"],
        "waiting_cut": round(1 - auto / off, 4) if off else None,
        "evictions_vs_fewest": round(runs["auto"]["evictions"] / fewest, 3) if fewest else None,
    }
