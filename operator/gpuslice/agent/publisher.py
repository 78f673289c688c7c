"""Publish the node's pool: plan, make safe, and write only when the content changed.

Each cycle reads this pool's slices from the API server, and the claims allocated from
the pool whenever the plan would remove or alter a published device, rather than from
watch caches: a freshly started agent can never mistake "not listed yet" for "not
allocated". The policies and the Node come from the agent's watches once they have
listed (``AgentView``): a stale one can only make the agent plan a change, and every
change is judged on claims read then.
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Any

import pydantic
import structlog
from prometheus_client import Counter, Gauge

from gpuslice.agent.coexistence import OtherDrivers
from gpuslice.agent.drain import Drains
from gpuslice.agent.dryrun import GenerationRefused, Refusals, dry_run, refused_policies
from gpuslice.agent.mig_manager import MigManager
from gpuslice.agent.published import Published, PublishedRecord
from gpuslice.agent.watches import AgentView
from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.dra.names import ATTR_POLICY, ATTRIBUTE_DOMAIN, DRIVER, PENDING_TAINT_KEY, RECONFIGURING_TAINT_KEY
from gpuslice.dra.resourceslice import resource_slice, slice_name
from gpuslice.inventory.gpus import Gpu
from gpuslice.kube.client import KubeClient, NotFound
from gpuslice.kube.watch import list_all
from gpuslice.observability.failpoints import failpoint
from gpuslice.planning.coexistence import other_driver_gpus, taken_gpus
from gpuslice.planning.defrag_taints import freeing_on_node, with_defrag_taints
from gpuslice.planning.left_out import ANNOTATION as LEFT_OUT
from gpuslice.planning.left_out import left_out_annotations
from gpuslice.planning.node_pool import NodePlan, PlannedSlice, plan_node_pool
from gpuslice.planning.pool_safety import SafePlan, changing, make_safe, normalized, with_statuses
from gpuslice.planning.taints import Taint, status_taints_by_gpu

FIELD_MANAGER = "gpuslice-agent"
CYCLES = Counter("gpuslice_agent_publish_cycles", "Publish cycles, by outcome.", ["outcome"])
DEVICES = Gauge("gpuslice_agent_devices", "Devices this agent publishes.")
HELD = Gauge("gpuslice_agent_held_devices", "Allocated devices kept as they were while a change waits.")
CLAIM_READS = Counter("gpuslice_agent_claim_reads", "Publish cycles that read every claim (a published device was"
                      " to change) or did not need to.", ["outcome"])
REFUSED = Gauge("gpuslice_agent_refused_policies",
                "Policies left out on this node: the API server refused their devices.")
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
POLICIES = "/apis/gpuslice.dev/v1alpha1/gpuslicepolicies"
ATTR_POLICY_KEY = f"{ATTRIBUTE_DOMAIN}/{ATTR_POLICY}"
log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class PublishResult:
    generation: int
    written: tuple[str, ...]
    deleted: tuple[str, ...]
    held: tuple[str, ...]
    notes: tuple[str, ...]
    draining: tuple[str, ...] = ()
    refused: tuple[str, ...] = ()  # policies left out: the API server refused their devices
    again: bool = False  # the MIG manager changed a GPU: publish again now

    @property
    def changed(self) -> bool:
        return bool(self.written or self.deleted)


async def allocated_devices(kube: KubeClient, node: str) -> set[str]:
    """Names of this pool's devices that some claim has allocated (every claim, in pages:
    the API server cannot select claims by pool). Not with admin access: that takes no device
    from anyone (the scheduler counts nothing taken), so it holds back no change of one."""
    found = set()
    claims, _ = await list_all(kube, "/apis/resource.k8s.io/v1/resourceclaims")
    for claim in claims:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or []:
            if result.get("driver") == DRIVER and result.get("pool") == node and not result.get("adminAccess"):
                found.add(str(result["device"]))
    return found


@dataclass(frozen=True)
class Policies:
    """The policies to plan from, and those whose published devices stay as they are (and why)."""

    plannable: list[GpuSlicePolicy]
    frozen: dict[str, str]


def _not_yet_valid(policy: GpuSlicePolicy) -> str | None:
    """Why the controller's verdict does not cover this spec; None when it is valid."""
    status = policy.status
    if status.observed_generation != policy.metadata.generation:
        return f"generation {policy.metadata.generation} is not validated by the controller yet"
    valid = next((c for c in status.conditions if c.type == "Valid"), None)
    if valid is None or valid.status != "True":
        return f"the controller found it invalid ({valid.reason if valid else 'no Valid condition'})"
    return None


async def read_policies(kube: KubeClient, unsupported: Mapping[str, str] | None = None) -> Policies:
    return sort_policies(await kube.list(POLICIES), unsupported)


def _parse(body: dict[str, Any]) -> GpuSlicePolicy | str:
    """The policy, or why it does not parse."""
    try:
        return GpuSlicePolicy.from_body(body)
    except pydantic.ValidationError as error:
        return f"it does not parse: {error.errors()[0]['msg'] if error.errors() else error}"


def sort_policies(bodies: Iterable[dict[str, Any]], unsupported: Mapping[str, str] | None = None,
                  parsed: dict[str, tuple[str, Any]] | None = None) -> Policies:
    """``unsupported``: slicing mode -> why this API server cannot serve it; such policies keep what
    they published (nothing, on a new node) rather than publish devices the server would mangle.
    ``parsed``: the agent's policies parsed at their resourceVersion, reused while it is the same
    (the models are frozen) and kept to the policies there are."""
    plannable, frozen = [], {}
    seen = set()
    for body in bodies:
        name, version = body["metadata"]["name"], body["metadata"].get("resourceVersion")
        seen.add(name)
        if body["metadata"].get("deletionTimestamp"):
            continue  # going away: its free devices go, allocated ones wait for their claims
        hit = parsed.get(name) if parsed is not None and version else None
        policy = hit[1] if hit is not None and hit[0] == version else _parse(body)
        if parsed is not None and version:
            parsed[name] = (version, policy)
        if isinstance(policy, str):
            frozen[name] = policy
            continue
        reason = (unsupported or {}).get(policy.spec.slicing.mode) or _not_yet_valid(policy)
        if reason is None:
            plannable.append(policy)
        else:
            frozen[name] = reason
    if parsed is not None:
        for name in set(parsed) - seen:
            del parsed[name]
    return Policies(plannable, frozen)


def _policy_of(device: dict[str, Any]) -> str | None:
    value = (device.get("attributes") or {}).get(ATTR_POLICY_KEY, {}).get("string")
    return str(value) if value is not None else None


def _pending(device: dict[str, Any]) -> bool:
    return any(t.get("key") == PENDING_TAINT_KEY for t in device.get("taints") or [])


def _reconfiguring(device: dict[str, Any]) -> bool:
    return any(t.get("key") == RECONFIGURING_TAINT_KEY for t in device.get("taints") or [])


def _content(spec: dict[str, Any]) -> Any:
    return normalized({"sharedCounters": spec.get("sharedCounters") or [], "devices": spec.get("devices") or []})


def _left_out(slice_: Mapping[str, Any]) -> str | None:
    return ((slice_.get("metadata") or {}).get("annotations") or {}).get(LEFT_OUT)


def _records(last: Published | None, generation: int, devices: list[dict[str, Any]],
             counter_sets: list[dict[str, Any]]) -> bool:
    """Whether ``last`` records this generation as published (quantities by value, taint times ignored)."""
    return last is not None and last.generation == generation and normalized(
        {"devices": last.devices, "sharedCounters": last.counter_sets}) == normalized(
        {"devices": devices, "sharedCounters": counter_sets})


def _generations(policies: Policies) -> dict[str, int | None]:
    return {p.name: p.metadata.generation for p in policies.plannable}


async def _reconfigure(mig: MigManager | None, kube: KubeClient, allocated: set[str],
                       published: list[dict[str, Any]], refused: set[str]) -> bool:
    """Let the MIG manager reconfigure a GPU that has drained, judged on the claims read in this cycle."""
    return await mig.reconfigure(kube, allocated, published, refused) if mig is not None else False


async def publish(kube: KubeClient, node: str, gpus: list[Gpu], drains: Drains | None = None,
                  refusals: Refusals | None = None, view: AgentView | None = None, *,
                  holds: Set[str] = frozenset(), record: PublishedRecord | None = None,
                  statuses: Mapping[str, Sequence[Taint]] | None = None,
                  mig: MigManager | None = None, unsupported: Mapping[str, str] | None = None,
                  others: OtherDrivers | None = None) -> PublishResult:
    """One cycle. ``drains``: free devices change only once no claim can get them any more (see
    agent.drain); ``refusals``: the policies whose devices the API server refused (agent.dryrun).
    With a synced ``view``, the policies and the Node come from the agent's watches; without,
    they are read.

    The node's kubelet plugin adds: ``holds``, devices it has prepared or is preparing (allocated,
    whatever the claims say yet); ``record``, what was last written (an empty pool, which the
    kubelet wiped, is taken to be what it says, so held devices come back unchanged); ``statuses``,
    taints by GPU UUID (unhealthy) laid onto every device of the GPU, held ones included; ``mig``,
    which makes static MIG layouts real (``mig_manager``: it adjusts the plan, adds its taints, and
    reconfigures a drained GPU after the write). ``unsupported``: slicing mode -> why the API
    server cannot serve it (``agent.startup``). A GPU another DRA driver publishes on the node is
    left out (its allocated devices held as any GPU's that went), and ``others`` tells people.
    GPUs the plan leaves out for a state only the agent sees (``planning.left_out``) are written on
    every slice of the pool, on an empty one when it has no device, for the controller.
    """
    drains = drains if drains is not None else Drains()
    refusals = refusals if refusals is not None else Refusals()
    if view is not None and view.synced:
        if view.node is None:
            raise NotFound(404, "NotFound", f'nodes "{node}" not found', {"details": {"kind": "nodes", "name": node}})
        node_body = view.node
        bodies = list(view.policies.values())
        policies = sort_policies(bodies, unsupported, view.parsed)
    else:
        node_body = await kube.get(f"/api/v1/nodes/{node}")
        bodies = await kube.list(POLICIES)
        policies = sort_policies(bodies, unsupported)
    labels = node_body["metadata"].get("labels") or {}
    # Every driver's slices on this node, in one read: ours, and the GPUs other drivers publish,
    # which this node's pool leaves out (planning.coexistence).
    on_node = await kube.list(SLICES, fieldSelector=f"spec.nodeName={node}")
    existing = [s for s in on_node if s["spec"].get("driver") == DRIVER and s["spec"]["pool"]["name"] == node]
    taken = taken_gpus(gpus, [other_driver_gpus(s["spec"]) for s in on_node if s["spec"].get("driver") != DRIVER])
    if others is not None:
        await others.report(kube, node, gpus, taken)
    gpus = [g for g in gpus if g.uuid not in taken]
    if mig is not None:
        gpus = await mig.refresh(gpus)
    published = [d for s in existing for d in s["spec"].get("devices") or []]
    counter_sets = [c for s in existing for c in s["spec"].get("sharedCounters") or []]
    last = record.load() if record is not None else None
    if not existing and last is not None and last.devices:
        published, counter_sets = last.devices, last.counter_sets
        log.warning("the pool's slices are gone (the kubelet wipes them when the plugin was away); republishing"
                    " from the agent's record, allocated devices unchanged", node=node, devices=len(published))
    if mig is not None:  # a GPU in MIG mode a whole-GPU policy takes, once nothing of it is published
        gpus = await mig.release(gpus, plan_node_pool(labels, gpus, policies.plannable), labels, published)

    async def planned(policies_now: list[GpuSlicePolicy]) -> NodePlan:
        plan = plan_node_pool(labels, gpus, policies_now)
        return await mig.adjust(plan, policies_now) if mig is not None else plan

    # A tainted device has drained once the API server refuses to let a claim have it; the claims are
    # read after that, so one that got it before is seen (and keeps it).
    await drains.load(kube, node)
    drained = await drains.refused(kube, node, {d["name"] for d in published if _pending(d) or _reconfiguring(d)})
    drained |= mig.drained(published) if mig is not None else set()
    # Only a plan that removes or alters a published device needs the claims (pool_safety.changing);
    # leaving refused policies out later only freezes more devices, so the first plan is the most
    # that can change.
    first = await planned([p for p in policies.plannable if p.name not in refusals.current(_generations(policies))])
    at_stake = changing(first, published, {d["name"] for d in published if _policy_of(d) in policies.frozen})
    # A GPU waiting for a MIG reconfiguration is judged on the claims too: never under a claim.
    needed = bool(at_stake or drained or (mig is not None and mig.pending))
    allocated = (await allocated_devices(kube, node) if needed else set()) | set(holds)
    CLAIM_READS.labels(outcome="read" if needed else "skipped").inc()
    current = {s["metadata"]["name"]: s for s in existing}
    generations = {int(s["spec"]["pool"]["generation"]) for s in existing}
    counts = {int(s["spec"]["pool"]["resourceSliceCount"]) for s in existing}
    generation = max(generations | ({last.generation} if last is not None else set()), default=0)

    while True:  # each round leaves out at least one more refused policy, or ends
        refused = refusals.current(_generations(policies))
        plan = await planned([p for p in policies.plannable if p.name not in refused])
        kept = {**policies.frozen, **refused}
        frozen = {d["name"] for d in published if _policy_of(d) in kept}
        safe: SafePlan = make_safe(plan, published, counter_sets, allocated, drained=drained, frozen=frozen)
        gpu_statuses = status_taints_by_gpu(statuses or {}, mig.statuses(allocated, published) if mig else {})
        slices = with_statuses(safe.slices, gpu_statuses)
        slices = with_defrag_taints(slices, freeing_on_node(bodies, node, datetime.datetime.now(datetime.UTC)))
        told = left_out_annotations(plan.left_out)
        if not slices and told:
            slices = (PlannedSlice("devices-00"),)
        wanted = {slice_name(node, s.suffix): s for s in slices}
        unchanged = (
            set(wanted) == set(current) and len(generations) == 1 and counts == {len(wanted)}
            and all(_content(current[name]["spec"]) == normalized({"sharedCounters": list(s.shared_counters),
                                                                   "devices": list(s.devices)})
                    and _left_out(current[name]) == told.get(LEFT_OUT) for name, s in wanted.items())
        )
        DEVICES.set(sum(len(s.devices) for s in slices))
        HELD.set(len(safe.held))
        REFUSED.set(len(refused))
        reconfiguring = mig.draining_devices(published) if mig is not None else set()
        listed = drains.wanted(set(safe.draining) | reconfiguring, {d["name"] for d in published},
                               {d["name"] for s in slices for d in s.devices})
        if unchanged or (not wanted and not current):
            await drains.write(kube, node, listed)
            if record is not None and existing and not _records(last, generation, published, counter_sets):
                # Slices of an earlier agent, or a generation recorded but never written (killed first).
                record.save(Published(generation, published, counter_sets))
            CYCLES.labels(outcome="unchanged").inc()
            again = await _reconfigure(mig, kube, allocated, published, drained)
            return PublishResult(generation, (), (), safe.held, plan.notes, safe.draining, tuple(sorted(refused)),
                                 again)
        manifests = {name: resource_slice(
            node, node_body["metadata"]["uid"], planned.suffix, generation + 1, len(wanted),
            shared_counters=list(planned.shared_counters), devices=list(planned.devices), annotations=told,
        ) for name, planned in wanted.items()}
        answers = await dry_run(kube, manifests.values(), FIELD_MANAGER)
        if not answers:
            break
        blamed = await refused_policies(kube, manifests.values(), answers, FIELD_MANAGER)
        if not set(blamed) - set(refused):
            raise GenerationRefused(f"the API server still refuses the pool's next generation: {blamed}")
        for name, reason in sorted(blamed.items()):
            log.warning("devices refused by the API server; the policy is left out on this node, its published"
                        " devices stay as they are", node=node, policy=name, reason=reason)
        refusals.record(blamed, _generations(policies))

    generation += 1  # the whole generation passed the dry run: write it
    await drains.write(kube, node, listed)  # devices that start draining are listed before they are tainted
    if record is not None:
        # Recorded before any of it is written: a claim may get a device of this generation as soon as
        # it is complete, and an agent killed before the record was saved, whose pool the kubelet then
        # wiped, republished an older one without that device (T9 of the December hostile review).
        record.save(Published(generation, [d for s in slices for d in s.devices],
                              [c for s in slices for c in s.shared_counters]))
    deleted = []
    for name in sorted(set(current) - set(wanted)):  # obsolete first, as the upstream helper does
        with contextlib.suppress(NotFound):
            await kube.delete(f"{SLICES}/{name}")
        deleted.append(name)
    written = []
    for name, manifest in manifests.items():
        await kube.apply(f"{SLICES}/{name}", manifest, field_manager=FIELD_MANAGER)
        written.append(name)
        failpoint("agent.slice-written")
    failpoint("agent.pool-written")  # the whole generation is written (its record saved before)
    CYCLES.labels(outcome="written").inc()
    again = await _reconfigure(mig, kube, allocated, published, drained)
    result = PublishResult(generation, tuple(written), tuple(deleted), safe.held, plan.notes, safe.draining,
                           tuple(sorted(refused)), again)
    log.info("published pool", node=node, generation=generation, devices=sum(len(s.devices) for s in slices),
             written=len(written), deleted=deleted, held=list(safe.held), draining=len(safe.draining),
             blocked_gpus=list(safe.blocked_gpus))
    if safe.held:
        log.warning("changes held back while claims hold devices", node=node, devices=list(safe.held))
    for note in plan.notes:
        log.warning("planner note", node=node, note=note)
    for name, reason in sorted({**policies.frozen, **refused}.items()):
        log.warning("policy's devices kept as published", node=node, policy=name, reason=reason)
    return result
