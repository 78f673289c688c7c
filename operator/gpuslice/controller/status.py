"""Build a policy's status from what reconciling found; keep transition times stable."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.api.status import (
    Condition,
    DeviceClassStatus,
    GpuSlicePolicyStatus,
    KindUsage,
    SliceCounts,
    TenantStatus,
)
from gpuslice.planning.kinds import DeviceKind, limit_bytes, quota
from gpuslice.planning.left_out import (
    DEVICE_PLUGIN,
    MIG_MODE_OFF,
    MIG_MODE_ON,
    MIG_MODE_ON_OPERATOR,
    MIG_MODE_ON_RESET,
    LeftOut,
)
from gpuslice.planning.node.mig_mode import mig_mode_step
from gpuslice.planning.reads.usage import Usage
from gpuslice.planning.selection import Problem, Selection

TENANCY_NOT_ENFORCED = "TenancyNotEnforced"
STATUS_REFUSED = "StatusRefused"  # the API server refused the status worked out (only Valid is written)


@dataclass(frozen=True)
class Findings:
    """Everything one reconcile learned about a policy."""

    problems: Sequence[Problem]
    selection: Selection
    published: int
    usage: Usage
    apply_errors: Sequence[str] = ()
    deleting: bool = False
    pending: int = 0  # devices held back by agents until their claims are released
    draining: int = 0  # free devices tainted by agents that are about to change or go
    kinds: Sequence[DeviceKind] = ()
    taken: Sequence[str] = ()  # objects of our names that tenants made first
    foreign: Sequence[str] = ()  # claims holding our devices outside the tenants
    mig_failed: int = 0  # devices of GPUs whose MIG reconfiguration failed (agents taint them mig-failed)
    unhealthy: int = 0  # devices of GPUs the agents found unhealthy
    publishing_nodes: Sequence[str] = ()  # while deleting: nodes whose agents still publish its devices
    other_drivers: Sequence[str] = ()  # selected nodes where another DRA driver publishes GPUs
    mig_manager_nodes: Sequence[str] = ()  # selected nodes where the GPU Operator's MIG manager runs (mig mode)
    left_out: Sequence[tuple[str, LeftOut]] = ()  # (node, GPU) its agent left out for the GPU's state
    selected_nodes: Sequence[str] | None = None  # the nodes to record (None: keep the record, not valid now)
    unselected: Sequence[str] = ()  # nodes publishing its devices that it does not select
    memory_unenforced: str = ""  # why a tenant's maxMemory cannot be put in force (the webhook's side)


def _condition(type_: str, ok: bool, reason: str, message: str) -> Condition:
    return Condition(type=type_, status="True" if ok else "False", reason=reason, message=message)


# What the agents left out, by reason (planning.left_out), worded here: an agent names only GPUs. The
# reasons that need a step on the node come first; MigModeOn is a transition the agent carries out.
_WHOLE = ("a GPU in MIG mode cannot be used whole (CUDA sees only its MIG devices; NVIDIA's toolkit gives it no"
          " whole-GPU entry), so no device of this policy is published on them")
LEFT_OUT = {
    DEVICE_PLUGIN: "{gpus} are on nodes whose allocatable advertises a device plugin's NVIDIA resources (nvidia.com/*:"
                   " NVIDIA's, HAMi or another; they name no GPU, so each GPU there counts as the plugin's), so no"
                   " device of this policy is published on them: a GPU both managed could be given to two pods."
                   " Turn the device plugin off on those nodes (the GPU Operator's: label them"
                   " nvidia.com/gpu.deploy.device-plugin=false) or keep this policy off them; the nodes' Events"
                   " (GpuAdvertisedByDevicePlugin) name the resources.",
    MIG_MODE_ON_RESET: "MIG mode is on on {gpus}: " + _WHOLE + ". These GPUs (before Hopper, such as A100 and A30)"
                       " switch MIG mode only at a GPU reset, which gpuslice does not do (a reset needs every client"
                       " of the GPU stopped: nvidia-persistenced, DCGM, device plugins); the agent destroys their"
                       " MIG instances once no claim holds a device of them. Then switch MIG mode off {steps}; the"
                       " agent publishes at its next cycle after.",
    MIG_MODE_OFF: "MIG mode is off on {gpus}, and these GPUs (before Hopper, such as A100 and A30) switch it only at a"
                  " GPU reset, which gpuslice does not do: nvidia-persistenced, DCGM and other clients keep the GPU"
                  " from resetting. So no MIG device of this policy is published on them. Enable MIG mode {steps};"
                  " the agent publishes at its next cycle after.",
    MIG_MODE_ON_OPERATOR: "MIG mode is on on {gpus}: " + _WHOLE + ". The GPU Operator's MIG manager runs on these"
                          " nodes (nvidia.com/gpu.deploy.mig-manager=true) and has the final say on their MIG mode:"
                          " {steps} (it then switches MIG mode off), or label the node"
                          " nvidia.com/gpu.deploy.mig-manager=false to let gpuslice manage it.",
    MIG_MODE_ON: "MIG mode is on on {gpus}: " + _WHOLE + " yet. These GPUs switch MIG mode without a reset (Hopper"
                 " and later): the agent destroys their MIG instances once no claim holds a device of them, switches"
                 " MIG mode off and publishes, with no step on the node. If this stays, the agent's log on the node"
                 " says what keeps it (such as a MIG instance in use outside gpuslice).",
}


def _steps(left_out: Sequence[tuple[str, LeftOut]], reason: str, most: int = 10) -> str:
    """The step on each node, for the GPUs left out there for ``reason``: the first ``most`` nodes."""
    by_node: dict[str, list[int]] = {}
    for node, item in left_out:
        if item.reason == reason:
            by_node.setdefault(node, []).append(item.index)
    nodes = sorted(by_node)
    if reason == DEVICE_PLUGIN:
        return ""  # its message says the step: no MIG mode to switch
    if reason == MIG_MODE_ON_OPERATOR:
        return (f"kubectl label node {' '.join(nodes[:most])} nvidia.com/mig.config=all-disabled --overwrite"
                + (f" (and {len(nodes) - most} more nodes)" if len(nodes) > most else ""))
    found = [f"on node {node}: {mig_mode_step(by_node[node], reason == MIG_MODE_OFF)}" for node in nodes[:most]]
    return "; ".join(found) + (f"; and on {len(nodes) - most} more nodes" if len(nodes) > most else "")


def conditions(f: Findings) -> list[Condition]:
    valid = _condition("Valid", True, "SpecValid", "The spec fits the selected GPUs and other policies.")
    if f.problems:
        valid = _condition("Valid", False, f.problems[0].reason, " ".join(p.message for p in f.problems))
    if f.published:
        published = _condition("Published", True, "DevicesPublished",
                               f"{f.published} devices published on {f.selection.node_count} nodes.")
    elif not f.selection.node_count:
        published = _condition("Published", False, "NoMatchingNodes",
                               "No node with GPUs matches spec.nodeSelector and spec.gpuSelector.")
    else:
        published = _condition("Published", False, "AwaitingNodeAgents",
                               f"{f.selection.node_count} nodes selected, but no gpuslice node agent has published"
                               " devices for this policy yet; check that the agent runs on them.")
    if f.deleting and f.usage.holding_claims:
        ready = _condition("Ready", False, "Deleting",
                           f"Waiting for {len(f.usage.holding_claims)} claims to release this policy's devices:"
                           f" {', '.join(f.usage.holding_claims[:10])}.")
    elif f.deleting:
        ready = _condition("Ready", False, "Deleting",
                           f"Waiting for the gpuslice node agents of {len(f.publishing_nodes)} nodes to remove this"
                           f" policy's devices: {', '.join(f.publishing_nodes[:10])}. Until they do, the policy stays"
                           " so that its tenancy rule keeps judging them; if a node's agent is gone for good, delete"
                           " that node's ResourceSlices of driver gpu.gpuslice.dev (or the Node).")
    elif f.problems and f.problems[0].reason == TENANCY_NOT_ENFORCED:
        ready = _condition("Ready", False, TENANCY_NOT_ENFORCED, "Tenancy is not enforced; see the Valid condition."
                           " Node agents publish no new devices of this policy until it is.")
    elif f.problems:
        ready = _condition("Ready", False, "InvalidSpec", "The spec is not valid; see the Valid condition."
                           " Objects created for an earlier valid spec are left as they were.")
    elif f.apply_errors:
        ready = _condition("Ready", False, "ApplyFailed", "; ".join(f.apply_errors))
    elif not f.published:
        ready = _condition("Ready", False, published.reason, published.message)
    else:
        ready = _condition("Ready", True, "Ready", "Tenants can claim slices with the claim template.")
    # One Degraded reason, the most urgent first.
    if f.apply_errors:
        degraded = _condition("Degraded", True, "ApplyFailed", "; ".join(f.apply_errors))
    elif f.foreign:
        degraded = _condition("Degraded", True, "ForeignClaims",
                              f"{len(f.foreign)} claims outside spec.tenants hold devices of this policy (allocated"
                              f" before their namespace left spec.tenants): {', '.join(f.foreign[:10])}. No new"
                              " allocation outside the tenants is admitted; delete these claims to return the devices.")
    elif f.unselected:
        degraded = _condition("Degraded", True, "DevicesOnUnselectedNodes",
                              f"{len(f.unselected)} nodes this policy does not select publish devices of it:"
                              f" {', '.join(f.unselected[:10])}. The tenancy rule refuses to allocate them (they"
                              " are not in status.selectedNodes) and deletion does not wait for them. A node agent"
                              " publishes devices only of the policies that select its node: check those nodes"
                              " (a compromised node, or an agent of another version) and delete their gpuslice"
                              " ResourceSlices.")
    elif f.taken:
        degraded = _condition("Degraded", True, "NameTaken",
                              f"{'; '.join(f.taken)}: made by someone else before gpuslice, so gpuslice leaves it"
                              " alone and that tenant gets no such template; delete or rename it, or choose another"
                              " spec.claimTemplateName.")
    elif f.memory_unenforced:
        degraded = _condition("Degraded", True, "MemoryLimitNotEnforced",
                              f"{f.memory_unenforced} Tenants with maxMemory wait: their claims of this policy are"
                              " refused until it is.")
    elif f.mig_failed:
        degraded = _condition("Degraded", True, "MigReconfigurationFailed",
                              f"{f.mig_failed} devices are on GPUs whose MIG reconfiguration to this policy's layout"
                              " failed and was rolled back to the last good layout; they are tainted"
                              " gpuslice.dev/mig-failed. The policy's Events say which GPU and why.")
    elif f.unhealthy:
        degraded = _condition("Degraded", True, "GpuUnhealthy",
                              f"{f.unhealthy} devices are on GPUs their node agent found unhealthy; they are tainted"
                              " gpuslice.dev/unhealthy (the node's Events say which GPU and why).")
    elif f.other_drivers:
        degraded = _condition("Degraded", True, "GpusOfAnotherDriver",
                              f"Another DRA driver publishes GPUs on nodes this policy selects: "
                              f"{'; '.join(f.other_drivers[:10])}. gpuslice's agent there publishes no GPU that"
                              " driver publishes (same UUID or PCI bus id), so a GPU is never allocated twice; turn"
                              " one driver off on each node (docs/nvidia.md#sharing-a-cluster). The nodes' Events"
                              " say which GPUs.")
    elif f.mig_manager_nodes:
        degraded = _condition("Degraded", True, "MigManagerActive",
                              f"The GPU Operator's MIG manager runs on {', '.join(f.mig_manager_nodes[:10])}"
                              " (nvidia.com/gpu.deploy.mig-manager=true) and would undo this policy's MIG instances,"
                              " so gpuslice publishes none of its devices there; label those nodes"
                              " nvidia.com/gpu.deploy.mig-manager=false to let gpuslice manage MIG.")
    elif reasons := [r for r in LEFT_OUT if any(item.reason == r for _, item in f.left_out)]:
        degraded = _condition("Degraded", True, reasons[0], " ".join(
            LEFT_OUT[r].format(gpus=_gpus(f.left_out, r), steps=_steps(f.left_out, r)) for r in reasons))
    elif f.pending:
        degraded = _condition("Degraded", True, "ChangePending",
                              f"{f.pending} allocated devices keep their old shape until their claims are released;"
                              " they are tainted gpuslice.dev/pending-change so nothing new lands on them.")
    else:
        degraded = _condition("Degraded", False, "AsExpected", "")
    return [valid, published, ready, degraded]


def _gpus(left_out: Sequence[tuple[str, LeftOut]], reason: str, most: int = 10) -> str:
    """``node n1 GPU 0 (NVIDIA A100-SXM4-40GB), ...`` for the items of ``reason``, the first ``most``."""
    found = [f"node {node} GPU {item.index} ({item.product})" for node, item in left_out if item.reason == reason]
    return ", ".join(found[:most]) + (f" and {len(found) - most} more" if len(found) > most else "")


def build_status(policy: GpuSlicePolicy, f: Findings, now: str) -> GpuSlicePolicyStatus:
    previous = {c.type: c for c in policy.status.conditions}
    stamped = []
    for condition in conditions(f):
        old = previous.get(condition.type)
        since = old.last_transition_time if old and old.status == condition.status else now
        stamped.append(condition.model_copy(update={
            "last_transition_time": since, "observed_generation": policy.metadata.generation,
        }))
    kinds = list(f.kinds)
    tenants = []
    for t in policy.spec.tenants:
        held = f.usage.kinds_by_namespace.get(t.namespace, {})
        limits = {k.kind: quota(t, k) for k in kinds}
        tenants.append(TenantStatus(
            namespace=t.namespace, allocated=f.usage.by_namespace.get(t.namespace, 0),
            limit=sum(v or 0 for v in limits.values()) if t.count_limited else None,
            allocated_bytes=f.usage.bytes_by_namespace.get(t.namespace, 0), limit_bytes=limit_bytes(t, kinds),
            kinds=[KindUsage(kind=k.kind, allocated=held.get(k.kind, 0), limit=limits[k.kind])
                   for k in kinds if t.count_limited or held.get(k.kind)],
        ))
    primary = next((k.class_name for k in kinds if k.primary), None)
    return GpuSlicePolicyStatus(
        observed_generation=policy.metadata.generation,
        conditions=stamped,
        device_class_name=primary,
        device_classes=[DeviceClassStatus(kind=k.kind, name=k.class_name, memory_bytes=k.memory) for k in kinds],
        foreign_claims=list(f.foreign),
        tenant_names=tenant_names([t.namespace for t in policy.spec.tenants]),
        nodes=f.selection.node_count,
        gpus=f.selection.gpu_count,
        slices=SliceCounts(published=f.published, allocated=f.usage.allocated),
        tenants=tenants,
        holding_claims=f.usage.holding_claims if f.deleting else [],
        selected_nodes=list(f.selected_nodes if f.selected_nodes is not None else policy.status.selected_nodes),
    )


def tenant_names(namespaces: Sequence[str], width: int = 60) -> str:
    """``team-a, team-b``; past ``width`` characters the rest is counted: ``team-a, team-b, +7``."""
    shown: list[str] = []
    for i, name in enumerate(namespaces):
        rest = len(namespaces) - i
        if shown and len(", ".join([*shown, name])) + (len(f", +{rest - 1}") if rest > 1 else 0) > width:
            return ", ".join([*shown, f"+{rest}"])
        shown.append(name)
    return ", ".join(shown)


def status_body(status: GpuSlicePolicyStatus) -> dict[str, Any]:
    return status.model_dump(by_alias=True, exclude_none=True, mode="json")
