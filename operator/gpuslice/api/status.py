"""The GpuSlicePolicy status: what a platform team and a tenant need to see."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from gpuslice.api.policy import Tenant
from gpuslice.api.rules import ApiModel

# The most nodes a policy may select: each is named in its status, which every allocation of the
# policy's devices is checked against (status.selectedNodes; at ~40 bytes a name, 40 KB).
MAX_SELECTED_NODES = 1000
NodeName = Annotated[str, StringConstraints(max_length=253)]


class Condition(ApiModel):
    """A condition in the Kubernetes style: True/False with a reason a human can act on."""

    type: str = Field(description="Valid, Published, Ready or Degraded.")
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(description="CamelCase reason, e.g. SliceLargerThanGpu.")
    message: str = Field(default="", description="What is wrong and what to do.")
    last_transition_time: str | None = Field(default=None, description="When status last changed.")
    observed_generation: int | None = Field(default=None, description="Generation this is about.")


class SliceCounts(ApiModel):
    """Devices of this policy across the cluster."""

    published: int = Field(default=0, description="Devices published in ResourceSlices.")
    allocated: int = Field(default=0, description="Devices allocated to ResourceClaims.")


class KindUsage(ApiModel):
    """One kind of device a tenant holds or may hold."""

    kind: str = Field(description="slice, full, shared, or a MIG profile such as 1g.10gb.")
    allocated: int = Field(default=0, description="Devices of this kind the namespace's claims hold.")
    limit: int | None = Field(default=None, description="The quota on this kind; unset means no limit.")


class TenantStatus(ApiModel):
    """Use against limit, per tenant namespace, in devices and in bytes of GPU memory."""

    namespace: str
    allocated: int = Field(default=0, description="Devices of this policy its claims hold.")
    limit: int | None = Field(default=None, description=(
        "Most devices it may hold (the sum of its quotas); unset means no limit."))
    allocated_bytes: int = Field(default=0, description=(
        "GPU memory its claims hold: each device's memory, or in shared mode the capacity each"
        " allocation consumed."))
    limit_bytes: int | None = Field(default=None, description=(
        "Most GPU memory it may hold: the sum over kinds of quota x the kind's memory (a whole GPU"
        " counts as the largest GPU the policy selects), at most 2^63-1; unset means no limit."))
    kinds: list[KindUsage] = Field(default_factory=list, description=(
        "Per kind of device: what it holds and its quota."))


class DeviceClassStatus(ApiModel):
    """A DeviceClass of this policy: one per kind of device, each with its own quota."""

    kind: str = Field(description="slice, full, shared, or a MIG profile such as 1g.10gb.")
    name: str = Field(description="The DeviceClass name claims use.")
    memory_bytes: int = Field(default=0, description=(
        "GPU memory one device of this kind stands for (the largest selected GPU for a whole GPU)."))


class ClassInForce(ApiModel):
    """A DeviceClass of this policy as the controller last put it in force (a valid spec,
    converged): the tenancy admission policy and the maxMemory webhook judge claims against this
    record, never against a spec the controller has not converged (an invalid edit, or one made
    while the controller is stalled, leaves the classes, devices and quotas as they were)."""

    name: str = Field(description="The DeviceClass name claims use.")
    kind: str = Field(description="slice, full, shared, or a MIG profile such as 1g.10gb.")
    shared: bool = Field(default=False, description=(
        "Whether its devices are shared (consumable capacity): one allocation takes a part of one."))
    memory: str = Field(description=(
        "The most GPU memory one allocation of this class stands for, as a quantity: the slice, the"
        " largest selected GPU, the profile, or in shared mode one sliceSize (what a tenant limited"
        " by maxSlices may take per allocation)."))
    least_memory: str = Field(description=(
        "The least GPU memory one allocation of this class holds (a whole GPU: the smallest selected"
        " GPU), as a quantity."))


class LimitsInForce(ApiModel):
    """A limited tenant's limits as its quota enforces them now (a copy of its spec.tenants entry's
    limits): the tenancy admission policy admits its claims only while they equal the spec's."""

    max_slices: int | None = None
    max_full_gpus: int | None = None
    max_mig_devices: dict[str, int] | None = None
    max_memory: str | None = Field(default=None, description=(
        "maxMemory as its ledger enforces it now (gpusliceledgers in gpuslice-system)."))

    @classmethod
    def of(cls, tenant: Tenant) -> LimitsInForce:
        """The limits ``tenant``'s spec entry says: what the record must equal for its claims to be admitted."""
        return cls(max_slices=tenant.max_slices, max_full_gpus=tenant.max_full_gpus,
                   max_mig_devices=dict(tenant.max_mig_devices) if tenant.max_mig_devices is not None else None,
                   max_memory=tenant.max_memory)


class AdmittedTenant(ApiModel):
    """A tenant namespace whose quota gpuslice has put in force. The tenancy admission policy
    admits claims only from these namespaces, and only from this incarnation (UID) of each; for a
    limited tenant only under the limits, of the classes and made after the time recorded here."""

    namespace: str
    uid: str
    limits: LimitsInForce | None = Field(default=None, description=(
        "A limited tenant's limits its quota enforces now (as status.hard of the quota shows); unset"
        " for a tenant without limits."))
    classes: list[str] | None = Field(default=None, description=(
        "A limited tenant: the policy's DeviceClasses its quota counts at those limits; claims of any"
        " other class of the policy (a kind just added) wait until it does."))
    since: str | None = Field(default=None, description=(
        "A limited tenant: when its quota was made. A claim made before then was never counted by it,"
        " so it is never allocated."))


class ObjectRef(ApiModel):
    """A namespaced object by name and UID."""

    namespace: str = Field(max_length=63)
    name: str = Field(max_length=253)
    uid: str = Field(default="", max_length=64)


MAX_REQUESTED_MOVE = 3600  # seconds from a requested move's start to its expiry (gpuslice-policy-status)


class DefragMove(ApiModel):
    """A GPU being freed for a waiting pod. Requested by gpuslice defrag --apply, or recorded by the
    controller in Auto mode, before anything is evicted, and removed once the waiting claim is
    allocated, the move fails, or it expires. A move past Requested (which only the controller
    writes: the admission rule gpuslice-policy-status) is one the controller judged itself: while it
    is here and unexpired, the node agent taints every device of the GPU but the one named
    (gpuslice.dev/defrag:NoSchedule), and the tenancy admission rule lets no claim but the waiting one
    (or one its pod owns) be allocated a device of the GPU. A Requested move does neither."""

    id: str = Field(max_length=32, description="Names the move: the value of its device taint.")
    node: str = Field(max_length=253, description="The node (and pool) of the GPU.")
    gpu: str = Field(max_length=128, description="The GPU's UUID.")
    gpu_tag: str = Field(max_length=32, description=(
        "gpu- and the UUID's first eight hex digits: every device of the GPU is named with it and '-' first."))
    gpu_index: int = Field(default=0, description="The GPU's index on its node, for people.")
    device: str = Field(max_length=253, description="The device the waiting claim asks for: left untainted.")
    claim: ObjectRef = Field(description="The waiting claim: the one claim the GPU's devices go to.")
    pod: ObjectRef = Field(description="The waiting pod (a claim it owns may be allocated too).")
    evictions: list[ObjectRef] = Field(default_factory=list, max_length=64, description=(
        "The pods the plan moves, by UID: nothing else is ever evicted for it."))
    evicted: list[str] = Field(default_factory=list, max_length=64, description=(
        "UIDs of the pods evicted so far (an eviction of a pod already gone is never sent again)."))
    by: str = Field(default="", max_length=253, description="controller (Auto) or gpuslice defrag and its user.")
    phase: Literal["Requested", "Tainting", "Evicting", "Placing"] = Field(default="Requested", description=(
        "Requested: recorded by someone other than the controller, not yet judged by it (nothing is"
        " tainted, reserved or evicted for it); Tainting: the controller's, waiting for the node agent to"
        " taint the GPU (nothing is evicted before); Evicting: the controller evicts the pods; Placing:"
        " they are gone, the waiting claim is to be allocated."))
    started: str = Field(description="When the move began (when the controller took a requested move up).")
    expires: str = Field(description=(
        "When the move gives up: the record goes and the taint lifts, whether or not the claim got the GPU."
        " The controller takes a requested move up until its own --defrag-timeout at most."))


class DefragOutcome(ApiModel):
    """How the last move for this policy ended."""

    id: str = Field(default="", max_length=32, description="The move's id.")
    time: str
    outcome: Literal["Freed", "Failed"]
    message: str = Field(default="", max_length=2048)


class DefragmentationStatus(ApiModel):
    """Moves under way and the Auto eviction budget. Written by gpuslice defrag --apply and the
    controller's defragmenter only, never by the status refresh."""

    in_flight: list[DefragMove] = Field(default_factory=list, max_length=16, description=(
        "GPUs being freed now. The tenancy admission policy and the node agents read this list."))
    evictions: list[str] = Field(default_factory=list, max_length=1000, description=(
        "Auto mode: when each of the controller's evictions of the last hour was (or is to be) sent:"
        " spec.defragmentation.maxEvictionsPerHour bounds it, across controller restarts."))
    last: DefragOutcome | None = Field(default=None, description="How the last move ended.")


class GpuSlicePolicyStatus(ApiModel):
    """Observed state, written by the gpuslice controller."""

    observed_generation: int | None = Field(default=None, description="Last generation acted on.")
    conditions: list[Condition] = Field(default_factory=list, description=(
        "Valid (the spec fits the selected GPUs and tenancy is enforced), Published (nodes publish"
        " its devices), Ready (tenants can claim slices), Degraded (something needs attention)."),
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]})
    device_class_name: str | None = Field(default=None, description=(
        "DeviceClass of the policy's slices (memory and shared mode)."))
    device_classes: list[DeviceClassStatus] = Field(default_factory=list, description=(
        "Every DeviceClass of the policy, one per kind of device."))
    tenant_names: str = Field(default="", description=(
        "The tenant namespaces, comma-separated (the Tenants column of kubectl get: a table column shows only"
        " the first item of a list)."))
    nodes: int = Field(default=0, description="Nodes selected that have GPUs.")
    gpus: int = Field(default=0, description="GPUs selected on those nodes.")
    slices: SliceCounts = Field(default_factory=SliceCounts, description="Published and allocated.")
    tenants: list[TenantStatus] = Field(default_factory=list, description="Per tenant use and limit.")
    holding_claims: list[str] = Field(default_factory=list, description=(
        "namespace/name of claims holding this policy's devices; deletion waits for them."))
    foreign_claims: list[str] = Field(default_factory=list, description=(
        "namespace/name of claims that hold this policy's devices outside its tenants (allocated"
        " before the namespace left spec.tenants); delete them to return the devices."))
    classes_in_force: list[ClassInForce] = Field(default_factory=list, description=(
        "Written by the controller only, when it converges a valid spec: the policy's DeviceClasses"
        " and the memory each allocation of them stands for, as they are in force. The tenancy"
        " admission policy and the maxMemory webhook read this, never the spec."),
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]})
    admitted_tenants: list[AdmittedTenant] = Field(default_factory=list, description=(
        "Written by the controller only: tenant namespaces (by UID) whose quota is in force, with the"
        " limits and classes it counts. The tenancy admission policy (manifests/admission.yaml) reads"
        " this list."),
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["namespace"]})
    selected_nodes: list[NodeName] = Field(default_factory=list, max_length=MAX_SELECTED_NODES, description=(
        "Written by the controller only: the nodes this policy's devices may be allocated on, those"
        " whose labels match spec.nodeSelector and that have GPUs (by their labels) or a gpuslice node"
        " agent, as of the last valid spec. The tenancy admission policy refuses an allocation of the"
        " policy's devices on any other node's pool, so a node agent cannot lure its tenants elsewhere."),
        json_schema_extra={"x-kubernetes-list-type": "set"})
    admin_access_labels: list[str] = Field(default_factory=list, description=(
        "Written by the controller only: namespaces where gpuslice set the admin-access label for"
        " this policy. The label is removed only where a policy recorded it, so a label someone"
        " else set is never taken away."),
        json_schema_extra={"x-kubernetes-list-type": "set"})
    defragmentation: DefragmentationStatus | None = Field(default=None, description=(
        "Written by gpuslice defrag --apply and the controller's Auto mode only: GPUs being freed for"
        " waiting pods (the tenancy admission policy and the node agents read them)."))
