"""Figure 6: topology. A seeded training trace of 1-, 2-, 4- and 8-GPU jobs on a fleet of real server
layouts (DGX H100, a PCIe server of L40S, H100 NVL bridged pairs: ``inventory.systems``), replayed twice on
the real control plane: whole GPUs with no constraint, as a device plugin places them, and gpuslice's
aligned templates (``spec.topology`` with its default alignments).

The same policy publishes the same devices in both runs; only the claims differ: ``count`` whole GPUs of
the policy's class, or the policy's ``<template>-full-x<count>`` (a 1-GPU job asks for one whole GPU in
both). The scheduler places what it can, in arrival order; the replay sees each allocation (polling the
claims twice a simulated minute), reads what the job's GPUs share from the devices' attributes, and ends
the job when the model says it is done (``bench.training``: a misaligned job runs slower and holds its
GPUs longer). No pod runner runs: a job counts as placed once its claim is allocated.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from typing import Any

from gpuslice.agent.gpus.fake import FakeBackend, parse_fake_gpus
from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.bench.harness import BenchCluster, create, wait_until
from gpuslice.bench.training import Job, Outcome, TrainingSpec, summarize, training_trace
from gpuslice.bench.workload import PAUSE, clear_namespace, ensure_namespace
from gpuslice.coordinates import (
    NODES,
    POLICIES,
    SLICES,
    claim_template_path,
    claim_templates_in,
    claims_in,
    pod_path,
    pods_in,
    policy_path,
)
from gpuslice.devcluster.nodes import fake_gpu_node
from gpuslice.dra.names import DRIVER
from gpuslice.dra.slice_wire import slice_devices, slice_pool
from gpuslice.dra.wire import allocation_results
from gpuslice.kube.client import KubeError, NotFound
from gpuslice.planning.devices import Device
from gpuslice.planning.node.node_pool import plan_node_pool
from gpuslice.planning.reads.topology import Place, achieved

NAMESPACE = "bench-topo"
POLICY = "bench-topo"
TEMPLATE = "train"
LABEL = {"gpuslice.dev/bench": "topology"}
SYSTEMS = ("dgx-h100", "pcie-l40s", "h100-nvl")
FULL_CLASS = f"full.{POLICY}.gpuslice.dev"
COUNTS = (2, 4, 8)


def policy() -> dict[str, Any]:
    return {"apiVersion": "gpuslice.dev/v1alpha1", "kind": "GpuSlicePolicy", "metadata": {"name": POLICY},
            "spec": {"nodeSelector": {"matchLabels": LABEL},
                     "slicing": {"mode": "memory", "sliceSize": "40Gi", "allowFullGpu": True},
                     "tenants": [{"namespace": NAMESPACE}], "claimTemplateName": TEMPLATE,
                     "topology": {"counts": list(COUNTS)}}}


def unaligned_template(count: int) -> dict[str, Any]:
    """``count`` whole GPUs, any of one node: what a device plugin's ``nvidia.com/gpu: N`` gets."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": f"any-x{count}", "namespace": NAMESPACE},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
                "deviceClassName": FULL_CLASS, "allocationMode": "ExactCount", "count": count}}]}}}}


def template_of(job: Job, mode: str) -> str:
    if job.gpus == 1:
        return f"{TEMPLATE}-full"
    return f"{TEMPLATE}-full-x{job.gpus}" if mode == "aligned" else f"any-x{job.gpus}"


def pod(name: str, template: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": PAUSE, "resources": {"claims": [{"name": "gpus"}]}}],
                     "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": template}]}}


def node_names(fleets: int) -> dict[str, str]:
    return {f"bench-topo-{system.split('-')[-1]}-{i}": system for i in range(fleets) for system in SYSTEMS}


def expected_devices(nodes: Mapping[str, str]) -> int:
    parsed = GpuSlicePolicy.from_body({**policy(), "metadata": {"name": POLICY}})
    return sum(len(plan_node_pool(LABEL, FakeBackend(n, parse_fake_gpus(s)).discover(), [parsed]).devices)
               for n, s in nodes.items())


async def places(cluster: BenchCluster) -> dict[tuple[str, str], Place]:
    """(pool, device) -> where its GPU sits, as the devices' attributes say."""
    found = {}
    for body in await cluster.api.list(SLICES, fieldSelector=f"spec.driver={DRIVER}"):
        pool = slice_pool(body["spec"]) or ""
        for raw in slice_devices(body["spec"]):
            device = Device.from_manifest(raw)
            if device is not None:
                facts = device.facts
                found[(pool, device.name)] = Place(f"{pool}/{device.gpu_uuid}", facts.numa_node, facts.pcie_root,
                                                   facts.nvlink_domain)
    return found


async def replay(cluster: BenchCluster, spec: TrainingSpec, trace: list[Job], mode: str,
                 where: Mapping[tuple[str, str], Place], say: Callable[[str], None]) -> dict[str, Any]:
    api = cluster.api
    jobs = {f"{mode}-{job.name}": job for job in trace}
    outcomes: dict[str, Outcome] = {name: Outcome(job) for name, job in jobs.items()}
    pending = sorted(jobs.items(), key=lambda item: (item[1].at, item[0]))
    started = time.monotonic()

    def minute() -> float:
        return (time.monotonic() - started) / spec.seconds_per_minute

    running: dict[str, float] = {}  # pod -> the minute the model says it ends
    while minute() < spec.minutes:
        now = minute()
        while pending and pending[0][1].at <= now:
            name, job = pending.pop(0)
            await create(api, pods_in(NAMESPACE), pod(name, template_of(job, mode)))
        with contextlib.suppress(KubeError, OSError):
            for claim in await api.list(claims_in(NAMESPACE)):
                owner = str((claim["metadata"].get("ownerReferences") or [{}])[0].get("name"))
                if owner not in outcomes or outcomes[owner].placed is not None:
                    continue
                results = allocation_results(claim)
                if not results:
                    continue
                held = [where[(r["pool"], r["device"])] for r in results if (r["pool"], r["device"]) in where]
                outcome = Outcome(jobs[owner], now, achieved(held) if len(held) > 1 else ())
                outcomes[owner] = outcome
                running[owner] = outcome.ends or now
        for name, ends in list(running.items()):
            if ends <= now:
                del running[name]
                with contextlib.suppress(NotFound):
                    await api.delete(pod_path(NAMESPACE, name), gracePeriodSeconds=0)
        await asyncio.sleep(spec.seconds_per_minute / 2)
    result = summarize(list(outcomes.values()), spec.minutes)
    say(f"topology: {mode}: {result['placed']} of {result['jobs']} jobs placed, mean wait {result['mean_wait_min']}"
        f" min, multi-GPU jobs on NVLink {result['share_nvlink']}, worst {result['share_worst']}; modelled work"
        f" {result['modelled_work_gpu_hours']} GPU-hours")
    await clear_namespace(cluster, NAMESPACE)
    return result


def _ratio(a: Any, b: Any) -> float | None:
    return round(float(a) / float(b), 3) if isinstance(a, int | float) and isinstance(b, int | float) and b else None


async def topology_figure(cluster: BenchCluster, spec: TrainingSpec, say: Callable[[str], None]) -> dict[str, Any]:
    nodes = node_names(spec.fleets)
    trace = training_trace(spec)
    say(f"topology: {len(trace)} training jobs, {spec.minutes:.0f} simulated minutes at {spec.seconds_per_minute} s"
        f" each, twice, on {len(nodes)} nodes ({', '.join(SYSTEMS)} x {spec.fleets})")
    api = cluster.api
    for name, system in nodes.items():
        body = fake_gpu_node(name, "h100-80gb", 8, system=system)
        body["metadata"]["labels"].update(LABEL)
        await create(api, NODES, body)
    await ensure_namespace(cluster, NAMESPACE)
    runs: dict[str, Any] = {}
    try:
        for node in nodes:
            await cluster.start_agent(node)
        await api.create(POLICIES, policy())
        want = expected_devices(nodes)

        async def ready() -> bool:
            for count in COUNTS:
                await api.get(claim_template_path(NAMESPACE, f"{TEMPLATE}-full-x{count}"))
            return len(await places(cluster)) == want

        await wait_until(ready, 300, f"the topology policy's {want} devices and its aligned templates")
        for count in COUNTS:
            await create(api, claim_templates_in(NAMESPACE), unaligned_template(count))
        where = await places(cluster)
        for mode in ("unaligned", "aligned"):
            runs[mode] = await replay(cluster, spec, trace, mode, where, say)
    except Exception as error:
        raise cluster.failed({"runs": runs}, error) from error
    finally:
        with contextlib.suppress(KubeError):
            await api.delete(policy_path(POLICY))

        async def gone() -> bool:
            return not [p for p in await api.list(POLICIES) if p["metadata"]["name"] == POLICY]

        with contextlib.suppress(Exception):
            await wait_until(gone, 180, "the topology policy to go")
        await cluster.stop_agents()
        await cluster.delete_nodes(list(nodes))
    unaligned, aligned = runs["unaligned"], runs["aligned"]
    return {
        "spec": {"seed": spec.seed, "minutes": spec.minutes, "seconds_per_minute": spec.seconds_per_minute,
                 "fleet": {s: spec.fleets for s in SYSTEMS}, "gpus": 8 * len(nodes), "jobs": len(trace),
                 "sizes": [list(s) for s in spec.sizes], "per_minute": spec.per_minute,
                 "mean_work_min": spec.mean_work, "model": "aligned 1.0, misaligned 0.71, worst 0.40 (a model)"},
        "unaligned": unaligned, "aligned": aligned,
        "aligned_share_vs_unaligned": _ratio(aligned["share_aligned"], unaligned["share_aligned"]),
        "modelled_work_ratio": _ratio(aligned["modelled_work_gpu_hours"], unaligned["modelled_work_gpu_hours"]),
    }
