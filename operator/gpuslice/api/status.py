"""The GpuSlicePolicy status: what a platform team and a tenant need to see."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gpuslice.api.rules import ApiModel


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


class TenantStatus(ApiModel):
    """Use against limit, per tenant namespace."""

    namespace: str
    allocated: int = Field(default=0, description="Devices of this policy its claims hold.")
    limit: int | None = Field(default=None, description="maxSlices, if set.")


class GpuSlicePolicyStatus(ApiModel):
    """Observed state, written by the gpuslice controller."""

    observed_generation: int | None = Field(default=None, description="Last generation acted on.")
    conditions: list[Condition] = Field(default_factory=list, description=(
        "Valid (the spec fits the selected GPUs), Published (nodes publish its devices),"
        " Ready (tenants can claim slices), Degraded (something needs attention)."),
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]})
    device_class_name: str | None = Field(default=None, description="DeviceClass tenants' claims use.")
    nodes: int = Field(default=0, description="Nodes selected that have GPUs.")
    gpus: int = Field(default=0, description="GPUs selected on those nodes.")
    slices: SliceCounts = Field(default_factory=SliceCounts, description="Published and allocated.")
    tenants: list[TenantStatus] = Field(default_factory=list, description="Per tenant use and limit.")
    holding_claims: list[str] = Field(default_factory=list, description=(
        "namespace/name of claims holding this policy's devices; deletion waits for them."))
