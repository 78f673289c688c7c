"""``gpuslice plan``: what a node agent would publish for some policies, without a cluster.

The same planning code as the agent (``planning.node.node_pool``) on fake GPUs of
the models asked for, so a platform team sees the exact slices before applying
a policy, and for static MIG layouts the reconfiguration steps the agent will
take (from the policies' previous version with ``--from``).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import yaml

from gpuslice.agent.gpus import GpuBackendError
from gpuslice.agent.gpus.fake import FakeBackend, parse_fake_gpus
from gpuslice.api.resource import GpuSlicePolicy, ParseProblem, parse_policy
from gpuslice.dra.resourceslice import resource_slice
from gpuslice.dra.wire import attribute, device_policy
from gpuslice.errors import GpusliceError
from gpuslice.inventory.gpus import Gpu
from gpuslice.planning.node.mig_layout import Instance, layout_targets, steps
from gpuslice.planning.node.node_pool import NodePlan, plan_node_pool


class PlanError(GpusliceError):
    pass


def load_policies(paths: list[Path]) -> list[GpuSlicePolicy]:
    policies: list[GpuSlicePolicy] = []
    for path in paths:
        for document in yaml.safe_load_all(path.read_text()):
            if not document:
                continue
            if document.get("kind") != "GpuSlicePolicy":
                raise PlanError(f"{path}: expected kind GpuSlicePolicy, found {document.get('kind')!r}")
            document["metadata"].setdefault("creationTimestamp", f"2000-01-01T00:00:{len(policies):02d}Z")
            parsed = parse_policy(document)
            if isinstance(parsed, ParseProblem):
                name = document.get("metadata", {}).get("name", "?")
                problems = "; ".join(f"spec.{'.'.join(map(str, e['loc'][1:]))}: {e['msg']}" for e in parsed.errors)
                raise PlanError(f"{path}: GpuSlicePolicy {name} is invalid: {problems}")
            policies.append(parsed)
    return policies


def reconfiguration(inventory: list[Gpu], plan: NodePlan, policies: list[GpuSlicePolicy],
                    before: dict[str, tuple[Instance, ...]]) -> list[str]:
    """The MIG manager's steps, GPU by GPU, from the instances ``before`` (none if absent) to the static
    layouts of ``plan``."""
    lines = []
    for uuid, target in sorted(layout_targets(plan.typed, policies).items()):
        gpu = next(g for g in inventory if g.uuid == uuid)
        sizes = {p.name: p.size for p in gpu.mig_profiles}
        todo = steps(gpu.mig_enabled, before.get(uuid, ()), target.instances, sizes)
        if todo:
            lines.append(f"#   GPU {gpu.index} ({gpu.product_name}): " + "; ".join(s.describe() for s in todo))
    if lines:
        lines.insert(0, "# MIG reconfiguration, one GPU at a time, each once no claim holds its devices"
                        f" ({'from the layouts of --from' if before else 'from GPUs without MIG instances'}):")
    return lines


def where(inventory: list[Gpu], index: object) -> str:
    """Where GPU ``index`` sits, as its devices say it (``inventory.topology``); what is not known is left out."""
    gpu = next((g for g in inventory if g.index == index), None)
    if gpu is None:
        return ""
    parts = [f"NUMA node {gpu.numa_node}" if gpu.numa_node is not None else "",
             f"PCIe root {gpu.pcie_root}" if gpu.pcie_root else "",
             f"NVLink domain {gpu.nvlink_domain}" if gpu.nvlink_domain else ""]
    found = ", ".join(p for p in parts if p)
    return f" ({found})" if found else ""


def preview(paths: list[Path], gpus: str, node: str, labels: dict[str, str],
            previous: list[Path] | None = None) -> str:
    policies = load_policies(paths)
    try:
        inventory = FakeBackend(node, parse_fake_gpus(gpus)).discover()
    except GpuBackendError as error:
        raise PlanError(str(error)) from None
    node_labels = {"kubernetes.io/hostname": node, **labels}
    plan = plan_node_pool(node_labels, inventory, policies)
    before: dict[str, tuple[Instance, ...]] = {}
    if previous:
        old = load_policies(previous)
        before = {u: t.instances for u, t in layout_targets(plan_node_pool(node_labels, inventory, old).typed,
                                                                 old).items()}
    manifests = [
        resource_slice(node, "<node-uid>", s.suffix, 1, len(plan.slices),
                       shared_counters=list(s.shared_counters), devices=list(s.devices))
        for s in plan.slices
    ]
    per_policy = Counter(device_policy(d) for d in plan.devices)
    per_gpu = Counter(attribute(d, "index") for d in plan.devices)
    lines = [f"# gpuslice plan for node {node}: {len(inventory)} GPU(s) ({gpus}), {len(policies)} policies",
             f"# {len(plan.slices)} slices: {len(plan.counter_sets)} counter sets, {len(plan.devices)} devices"]
    lines += [f"#   policy {name}: {count} devices" for name, count in sorted(per_policy.items())]
    lines += [f"#   GPU {index}: {count} devices{where(inventory, index)}" for index, count in sorted(per_gpu.items())]
    lines += [f"#   note: {note}" for note in plan.notes]
    if not plan.devices:
        lines.append("#   no devices: no policy selects these GPUs (check nodeSelector, gpuSelector, --node-label)")
    lines += reconfiguration(inventory, plan, policies, before)
    return "\n".join(lines) + "\n" + "".join("---\n" + yaml.safe_dump(m, sort_keys=False) for m in manifests)
