"""Claims of several whole GPUs that sit together: the templates ``spec.topology`` makes (pure).

One request, ``gpus``, of ``count`` whole GPUs, as a ``firstAvailable`` list: one subrequest per
alignment, named after it (``nvlink-numa``), and for each a ``matchAttribute`` constraint per
attribute it names, scoped to that subrequest (``gpus/nvlink-numa``). The allocator applies a
constraint only when the subrequest it names is the one being tried, and takes the first subrequest
a node can meet whole (``k8s.io/dynamic-resource-allocation/structured``: ``matchAttributeConstraint``;
a device without the attribute never satisfies it), so a claim gets the best alignment there is room
for, or waits. Its allocation's results name the subrequest (``gpus/nvlink-numa``): that is the
alignment granted, in the claim itself.

What counts against the tenant is what any whole GPU does: ResourceQuota charges a ``firstAvailable``
request by its largest subrequest per class (``count`` whole GPUs of the ``full`` class), the maxMemory
webhook the devices allocated, and the tenancy rule judges every subrequest's class.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuslice.api.policy import Tenant
from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.api.topology import AlignmentChoice
from gpuslice.inventory.topology import ALIGNMENT_ATTRIBUTES, ALIGNMENTS
from gpuslice.planning.kinds import FULL, DeviceKind, aligned_template_name, quota

REQUEST = "gpus"  # the one request of an aligned template; results name gpus/<alignment>
ALIGNED_LABEL = "gpuslice.dev/aligned-gpus"  # on the claims the templates make: how many GPUs they align


@dataclass(frozen=True)
class AlignedTemplate:
    name: str
    kind: DeviceKind  # the policy's whole GPU
    count: int
    alignments: tuple[AlignmentChoice, ...]


def aligned_templates(policy: GpuSlicePolicy, tenant: Tenant, kinds: list[DeviceKind]) -> list[AlignedTemplate]:
    """The aligned templates ``tenant`` gets: one per count of whole GPUs it may hold (maxFullGpus; a
    count its quota would always refuse is no template). maxMemory is judged at allocation, on the GPUs
    the scheduler picked (``why`` says OverMemory), as for any claim."""
    topology = policy.spec.topology
    full = next((k for k in kinds if k.kind == FULL), None)
    if topology is None or full is None:
        return []
    limit = quota(tenant, full)
    return [AlignedTemplate(aligned_template_name(policy.spec.claim_template_name, count), full, count,
                            tuple(topology.alignments))
            for count in sorted(topology.counts) if limit is None or count <= limit]


def aligned_claim_spec(template: AlignedTemplate) -> dict[str, Any]:
    """The ResourceClaimSpec of an aligned template."""
    ways = [{"name": a.name, "deviceClassName": template.kind.class_name, "allocationMode": "ExactCount",
             "count": template.count} for a in template.alignments]
    constraints = [{"requests": [f"{REQUEST}/{a.name}"], "matchAttribute": ALIGNMENT_ATTRIBUTES[level]}
                   for a in template.alignments for level in ALIGNMENTS if level in a.match]
    devices: dict[str, Any] = {"requests": [{"name": REQUEST, "firstAvailable": ways}]}
    if constraints:
        devices["constraints"] = constraints
    return {"devices": devices}
