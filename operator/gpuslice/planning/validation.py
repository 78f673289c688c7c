"""Semantic validation: does a policy make sense for the GPUs it selects, and
does it get along with the other policies on them?

Admission has already checked the policy's shape; what needs the cluster's
inventory is judged here. The answer becomes the policy's ``Valid`` condition,
and an invalid policy changes nothing that was already created.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.api.status import MAX_SELECTED_NODES
from gpuslice.dra.names import CONTROLLER_NAMESPACE
from gpuslice.planning.kinds import all_template_names
from gpuslice.planning.modes import MODES, device_kinds, mode_of
from gpuslice.planning.selection import Problem, Selection, seniority

__all__ = ["validate"]

EXCLUSIVE_MODES = tuple(m.name for m in MODES.values() if m.exclusive)  # GPUs no other policy may slice


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
        elif shared_gpus and policy.spec.slicing.isolation != other.spec.slicing.isolation:
            node = sorted(shared_gpus)[0][0]
            problems.append(Problem(
                "ConflictingIsolation",
                f"this policy (isolation {policy.spec.slicing.isolation}) and the older GpuSlicePolicy {other.name}"
                f" (isolation {other.spec.slicing.isolation}) select the same GPUs (e.g. on {node}); one MPS control"
                " daemon serves every client of a GPU, so policies sharing GPUs need the same slicing.isolation."
                " Set it alike, or narrow spec.nodeSelector or spec.gpuSelector of one of them.",
            ))
        common = tenants & {t.namespace for t in other.spec.tenants}
        clash = (all_template_names(policy, device_kinds(policy, Selection(())))
                 & all_template_names(other, device_kinds(other, Selection(()))))
        if common and clash:
            problems.append(Problem(
                "ClaimTemplateConflict",
                f"spec.claimTemplateName {policy.spec.claim_template_name} makes the template {sorted(clash)[0]},"
                f" which GpuSlicePolicy {other.name} also makes in namespace {sorted(common)[0]}; choose another"
                " claimTemplateName.",
            ))
        ext = policy.spec.extended_resource_name
        if ext and ext == other.spec.extended_resource_name:
            problems.append(Problem(
                "ExtendedResourceConflict",
                f"spec.extendedResourceName {ext} is already served by GpuSlicePolicy {other.name};"
                " choose another name.",
            ))
    return problems


def _foreign_class_problems(policy: GpuSlicePolicy, foreign_extended: Mapping[str, str]) -> list[Problem]:
    ext = policy.spec.extended_resource_name
    if ext and ext in foreign_extended:
        return [Problem(
            "ExtendedResourceConflict",
            f"spec.extendedResourceName {ext} is already served by DeviceClass {foreign_extended[ext]}, which"
            " gpuslice did not make (of two classes with one extended resource the scheduler uses only one);"
            " choose another extendedResourceName or remove it from that DeviceClass.",
        )]
    return []


def _namespace_problems(policy: GpuSlicePolicy, controller_namespace: str) -> list[Problem]:
    named = {t.namespace for t in policy.spec.tenants} | set(policy.spec.admin_access.namespaces)
    if controller_namespace in named:
        return [Problem(
            "ControllerNamespace",
            f"namespace {controller_namespace} is where the gpuslice controller runs; it cannot be a tenant or an"
            " admin namespace (the controller proves that tenancy is enforced by being refused a claim there);"
            " remove it from spec.tenants and spec.adminAccess.namespaces.",
        )]
    return []


def _node_count_problems(nodes: int) -> list[Problem]:
    if nodes <= MAX_SELECTED_NODES:
        return []
    return [Problem(
        "TooManyNodes",
        f"spec.nodeSelector matches {nodes} GPU nodes; a policy may select at most {MAX_SELECTED_NODES}, since"
        " each is named in status.selectedNodes, which every allocation of its devices is checked against;"
        " narrow spec.nodeSelector, or split the nodes between several policies (by a label per pool).",
    )]


def validate(
    policy: GpuSlicePolicy,
    selection: Selection,
    others: Sequence[tuple[GpuSlicePolicy, Selection]],
    *,
    foreign_extended: Mapping[str, str] | None = None,
    controller_namespace: str = CONTROLLER_NAMESPACE,
    selected_nodes: int = 0,
) -> list[Problem]:
    """Everything wrong with ``policy`` in this cluster; empty when it is valid.
    ``foreign_extended`` maps the extended resources of DeviceClasses gpuslice did not make to those classes;
    ``selected_nodes`` is how many nodes it selects (``selection.selected_nodes``)."""
    return (mode_of(policy).fit_problems(policy, selection) + _conflicts(policy, selection, others)
            + _foreign_class_problems(policy, foreign_extended or {})
            + _namespace_problems(policy, controller_namespace) + _node_count_problems(selected_nodes))
