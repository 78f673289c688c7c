"""What the agent does about a pod that uses more GPU memory than it was allocated.

- An Event on the pod, ``GpuMemoryOveruse`` (and ``GpuMemoryOveruseEnded`` once it is back within),
  naming the GPU, the use, the allocation and the policy.
- A condition on each device its claims hold on that GPU, in the claim's ``status.devices``
  (KEP-4817: the driver's own view of an allocated device): ``type: GpuMemoryOveruse``,
  ``status: True`` while it lasts, ``False`` after. ``kubectl get resourceclaim -o yaml``,
  ``gpuslice status`` (the over-full slice) and ``gpuslice why`` (who overused a GPU) read it. The
  agent applies it server-side as ``gpuslice-agent-<node>``, so it owns only its own entries;
  from Kubernetes 1.36 writing ``status.devices`` needs ``associated-node:patch`` on
  ``resourceclaims/driver`` for gpu.gpuslice.dev, which the agent's ClusterRole grants (the API
  server checks that the agent's token is bound to the node the claim is allocated on).
- With the policy's ``onOveruse: Evict``, an eviction (``pods/eviction``, with the pod's UID as a
  precondition), so PodDisruptionBudgets hold: a refused eviction (429) is an Event
  ``GpuMemoryOveruseEvictionBlocked`` and is tried again at the next usage pass.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

import structlog

from gpuslice.agent.events import pod_ref, record_event
from gpuslice.dra.names import DRIVER
from gpuslice.dra.quantity import format_bytes
from gpuslice.kube.client import KubeClient, KubeError
from gpuslice.planning.gpu_use import PodGpuUse

log = structlog.get_logger(__name__)
CONDITION = "GpuMemoryOveruse"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"


def describe(use: PodGpuUse, tolerance: float) -> str:
    where = f" (container {use.container})" if use.container else ""
    return (f"pod {use.pod}{where} uses {format_bytes(use.used)} of GPU memory on GPU {use.gpu}, more than the"
            f" {format_bytes(use.allocated)} its claims ({', '.join(use.claims)}) were allocated there (policy"
            f" {use.policy}, tolerance {tolerance:.0%}); its neighbours on the GPU may fail to allocate")


@dataclass
class OveruseActions:
    kube: KubeClient
    node: str

    @property
    def manager(self) -> str:
        return f"gpuslice-agent-{self.node}"

    async def started(self, use: PodGpuUse, uid: str, tolerance: float, evict: bool) -> str:
        """Report the overuse (Event, claim condition), and evict when the policy says so; what was done
        (``reported``, ``evicted`` or ``eviction_blocked``)."""
        message = describe(use, tolerance)
        log.warning("a pod uses more GPU memory than it was allocated", node=self.node, pod=str(use.pod),
                    gpu=use.gpu, used=use.used, allocated=use.allocated, policy=use.policy)
        await record_event(self.kube, self.node, pod_ref(use.pod.namespace, use.pod.name, uid), CONDITION, message)
        await self.condition(use, True, "OverAllocation", message)
        return await self.evict(use, uid) if evict else "reported"

    async def ended(self, use: PodGpuUse, uid: str) -> None:
        message = (f"pod {use.pod} is back within its {format_bytes(use.allocated)} on GPU {use.gpu} (uses"
                   f" {format_bytes(use.used)})")
        await record_event(self.kube, self.node, pod_ref(use.pod.namespace, use.pod.name, uid),
                           f"{CONDITION}Ended", message, kind="Normal")
        await self.condition(use, False, "WithinAllocation", message)

    async def condition(self, use: PodGpuUse, status: bool, reason: str, message: str) -> None:
        """Apply the condition to every device the pod's claims hold on the GPU."""
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        by_claim: dict[str, list[dict[str, Any]]] = {}
        for holding in use.holdings:
            entry: dict[str, Any] = {"driver": DRIVER, "pool": self.node, "device": holding.device, "conditions": [{
                "type": CONDITION, "status": "True" if status else "False", "reason": reason,
                "message": message[:32768], "lastTransitionTime": now}]}
            if holding.share_id:
                entry["shareID"] = holding.share_id
            if entry not in by_claim.setdefault(holding.claim, []):
                by_claim[holding.claim].append(entry)
        for claim, devices in by_claim.items():
            namespace, name = claim.split("/", 1)
            body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                    "metadata": {"name": name, "namespace": namespace}, "status": {"devices": devices}}
            try:
                await self.kube.apply(CLAIMS.format(namespace=namespace, name=name) + "/status", body,
                                      field_manager=self.manager)
            except KubeError as error:
                log.warning("could not set the overuse condition on the claim", node=self.node, claim=claim,
                            error=str(error))

    async def evict(self, use: PodGpuUse, uid: str, tell: bool = True) -> str:
        """Evict the pod (``tell``: say so in an Event if a PodDisruptionBudget refuses it)."""
        body = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": use.pod.name, "namespace": use.pod.namespace},
                "deleteOptions": {"preconditions": {"uid": uid}}}
        try:
            await self.kube.create(f"/api/v1/namespaces/{use.pod.namespace}/pods/{use.pod.name}/eviction", body)
        except KubeError as error:
            if error.status == 404:
                return "evicted"  # gone already
            blocked = error.status == 429
            log.warning("the overusing pod could not be evicted; will try again", node=self.node, pod=str(use.pod),
                        error=str(error))
            if blocked and tell:
                await record_event(
                    self.kube, self.node, pod_ref(use.pod.namespace, use.pod.name, uid), f"{CONDITION}EvictionBlocked",
                    f"pod {use.pod} uses more GPU memory than it was allocated and its policy {use.policy} says"
                    f" onOveruse: Evict, but the eviction was refused ({error.message}); a PodDisruptionBudget"
                    " holds it; the agent tries again")
            return "eviction_blocked"
        log.warning("evicted a pod that used more GPU memory than it was allocated", node=self.node,
                    pod=str(use.pod), gpu=use.gpu, policy=use.policy)
        return "evicted"
