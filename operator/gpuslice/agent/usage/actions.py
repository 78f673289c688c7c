"""What the agent does about a pod that uses more GPU memory than it was allocated: it marks the
pod's claims, and nothing else.

The mark (``planning.overuse``) is a condition ``GpuMemoryOveruse`` on each device the pod's claims
hold on that GPU, in the claim's ``status.devices`` (KEP-4817: the driver's own view of an
allocated device): ``status: True`` naming the pods over their allocation there (its ``data``),
``False`` once none is. ``kubectl get resourceclaim -o yaml``, ``gpuslice status`` (the over-full
slice) and ``gpuslice why`` (who overused a GPU) read it, and the controller acts on it: the
Events on the pod and, with the policy's ``onOveruse: Evict``, the eviction
(``controller/overuse.py``). The agent applies it server-side as ``gpuslice-agent-<node>``, so it
owns only its own entries; writing ``status.devices`` needs ``associated-node:patch`` on
``resourceclaims/driver`` for gpu.gpuslice.dev, which the API server grants only for claims
allocated on the node the agent's token is bound to. The agent may neither evict pods nor post
Events outside ``default`` (a stolen agent token hurts one node).
"""

from __future__ import annotations

from collections.abc import Mapping

import structlog

from gpuslice.coordinates import claim_status_path
from gpuslice.kube.client import KubeClient, KubeError, NotFound
from gpuslice.planning.overuse import DeviceKey, Mark, device_entry

log = structlog.get_logger(__name__)


async def apply_marks(kube: KubeClient, node: str, claim: str, marks: Mapping[DeviceKey, Mark]) -> bool:
    """Write every mark of this agent on the claim (an entry left out of a server-side apply would be
    removed); whether the claim now says so (False: try again at the next pass). A claim that is gone
    needs no mark."""
    namespace, name = claim.split("/", 1)
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "status": {"devices": [device_entry(key, mark) for key, mark in sorted(marks.items())]}}
    try:
        await kube.apply(claim_status_path(namespace, name), body,
                         field_manager=f"gpuslice-agent-{node}")
    except NotFound:
        return True
    except KubeError as error:
        log.warning("could not mark the claim's overuse; will try again", node=node, claim=claim, error=str(error))
        return False
    return True
