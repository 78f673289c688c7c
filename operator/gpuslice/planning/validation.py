"""Semantic validation: does a policy make sense for the GPUs it selects, and
does it get along with the other policies on them?

Admission has already checked the policy's shape; what needs the cluster's
inventory is judged here. The answer becomes the policy's ``Valid`` condition,
and an invalid policy changes nothing that was already created.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.dra.quantity import format_bytes
from gpuslice.inventory.nodes import NodeGpus
from gpuslice.planning.mig import static_layout

EXCLUSIVE_MODES = ("shared", "mig")  # a GPU in these modes cannot also be sliced by another policy


@dataclass(frozen=True)
class Problem:
    reason: str
    message: str


@dataclass(frozen=True)
class Selection:
    """The GPUs a policy selects, node by node."""

    gpus: tuple[NodeGpus, ...]

    @property
    def node_count(self) -> int:
        return len(self.gpus)

    @property
    def gpu_count(self) -> int:
        return sum(g.count for g in self.gpus)

    @property
    def nodes(self) -> frozenset[str]:
        return frozenset(g.node for g in self.gpus)


def select(policy: GpuSlicePolicy, inventory: Iterable[tuple[dict[str, str], NodeGpus]]) -> Selection:
    """Nodes whose labels match the node selector, with GPUs that match the GPU selector."""
    chosen = []
    gpu_selector = policy.spec.gpu_selector
    for labels, gpus in inventory:
        if not policy.spec.node_selector.matches(labels):
            continue
        if gpu_selector.products and gpus.product_name not in gpu_selector.products:
            continue
        if gpus.memory < gpu_selector.min_memory_bytes:
            continue
        chosen.append(gpus)
    return Selection(tuple(sorted(chosen, key=lambda g: g.node)))


# Slices of one GPU in memory mode: enough for any real sharing (MIG has 7, MPS 48 clients), and
# a bound on what a tiny sliceSize would make the agent publish and the scheduler consider.
MAX_SLICES_PER_GPU = 64
MI = 1024**2


def _fit_problems(policy: GpuSlicePolicy, selection: Selection) -> list[Problem]:
    slicing = policy.spec.slicing
    if not selection.gpus:
        return []
    if slicing.mode in ("memory", "shared"):
        largest = max(selection.gpus, key=lambda g: g.memory)
        if slicing.slice_bytes > largest.memory:
            return [Problem(
                "SliceLargerThanGpu",
                f"slicing.sliceSize {slicing.slice_size} is larger than every selected GPU (the largest is"
                f" {largest.product_name} with {format_bytes(largest.memory)} on {largest.node}); choose"
                f" a sliceSize of at most {format_bytes(largest.memory)}.",
            )]
        if slicing.mode == "memory" and largest.memory // slicing.slice_bytes > MAX_SLICES_PER_GPU:
            least = -(-largest.memory // MAX_SLICES_PER_GPU)
            least = -(-least // MI) * MI
            return [Problem(
                "TooManySlices",
                f"slicing.sliceSize {slicing.slice_size} cuts {largest.product_name} ({format_bytes(largest.memory)}"
                f" on {largest.node}) into {largest.memory // slicing.slice_bytes} slices; at most"
                f" {MAX_SLICES_PER_GPU} per GPU are published; choose a sliceSize of at least {format_bytes(least)}.",
            )]
        return []
    assert slicing.mig is not None
    problems = []
    wanted = list(slicing.mig.profiles or []) + list(slicing.mig.layout or {})
    for gpus in selection.gpus:
        if gpus.model is None:
            continue  # a product the catalog does not know: the node agent will judge it
        if not gpus.model.mig_capable:
            problems.append(Problem(
                "GpuNotMigCapable",
                f"mode mig selects {gpus.product_name} on {gpus.node}, which has no MIG; narrow"
                " spec.gpuSelector.products or spec.nodeSelector to MIG-capable GPUs.",
            ))
            continue
        for profile in wanted:
            if gpus.model.mig_profile(profile) is None:
                offered = ", ".join(dict.fromkeys(p.name for p in gpus.model.mig_profiles))
                problems.append(Problem(
                    "UnknownMigProfile",
                    f"MIG profile {profile} does not exist on {gpus.product_name} ({gpus.node});"
                    f" it offers {offered}.",
                ))
        layout = slicing.mig.layout
        if layout and all(gpus.model.mig_profile(p) for p in layout) and static_layout(gpus.model, layout) is None:
            problems.append(Problem(
                "MigLayoutDoesNotFit",
                f"slicing.mig.layout {dict(layout)} does not fit {gpus.product_name} ({gpus.node}): its"
                f" instances need more memory slices than the GPU's 8, or overlap in every placement;"
                " use fewer or smaller instances.",
            ))
    # One problem per reason and profile is enough to act on; keep the first of each.
    unique: dict[tuple[str, str], Problem] = {}
    for problem in problems:
        unique.setdefault((problem.reason, problem.message.split(" (")[0]), problem)
    return list(unique.values())


def seniority(policy: GpuSlicePolicy) -> tuple[str, int, str]:
    """Older first. Creation times have one-second resolution; within the same second a
    policy that is already valid (serving tenants) stays ahead of one that is not yet."""
    valid = any(c.type == "Valid" and c.status == "True" for c in policy.status.conditions)
    return (policy.metadata.creation_timestamp, 0 if valid else 1, policy.name)


def _older(a: GpuSlicePolicy, b: GpuSlicePolicy) -> bool:
    return seniority(a) < seniority(b)


def _conflicts(
    policy: GpuSlicePolicy, selection: Selection, others: Sequence[tuple[GpuSlicePolicy, Selection]]
) -> list[Problem]:
    """Problems with older policies: the newer of two conflicting policies yields."""
    problems = []
    mine = {(g.node, g.product_name) for g in selection.gpus}
    tenants = {t.namespace for t in policy.spec.tenants}
    for other, other_selection in others:
        if other.name == policy.name or not _older(other, policy):
            continue
        shared_gpus = mine & {(g.node, g.product_name) for g in other_selection.gpus}
        modes = {policy.spec.slicing.mode, other.spec.slicing.mode}
        if shared_gpus and (modes & set(EXCLUSIVE_MODES)):
            node = sorted(shared_gpus)[0][0]
            problems.append(Problem(
                "ConflictingPolicy",
                f"this policy ({policy.spec.slicing.mode} mode) and the older GpuSlicePolicy {other.name}"
                f" ({other.spec.slicing.mode} mode) select the same GPUs (e.g. on {node}); only memory-mode"
                " policies can share GPUs. Narrow spec.nodeSelector or spec.gpuSelector of one of them.",
            ))
        common = tenants & {t.namespace for t in other.spec.tenants}
        if common and other.spec.claim_template_name == policy.spec.claim_template_name:
            problems.append(Problem(
                "ClaimTemplateConflict",
                f"spec.claimTemplateName {policy.spec.claim_template_name} is already used by GpuSlicePolicy"
                f" {other.name} in namespace {sorted(common)[0]}; choose another claimTemplateName.",
            ))
        ext = policy.spec.extended_resource_name
        if ext and ext == other.spec.extended_resource_name:
            problems.append(Problem(
                "ExtendedResourceConflict",
                f"spec.extendedResourceName {ext} is already served by GpuSlicePolicy {other.name};"
                " choose another name.",
            ))
    return problems


def validate(
    policy: GpuSlicePolicy, selection: Selection, others: Sequence[tuple[GpuSlicePolicy, Selection]]
) -> list[Problem]:
    """Everything wrong with ``policy`` in this cluster; empty when it is valid."""
    return _fit_problems(policy, selection) + _conflicts(policy, selection, others)
