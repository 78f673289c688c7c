"""A fragmented fleet in the objects the API server holds: published slices, the pods on them with
their claims (made from a template, for the pod), disruption budgets, and pods that wait."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuslice.planning.defrag.facts import ClaimFacts, DisruptionBudget, PodFacts, opted_out_namespaces
from gpuslice.planning.defrag.model import Cluster, Plan, waiting_pods
from gpuslice.planning.defrag.planner import plan_defrag
from gpuslice.planning.reads.node_fit import NodeFacts
from gpuslice.planning.reads.published import read_pools
from tests.unit.planning.cluster_state import Body, gpus, policy_body, published, tag

INFERENCE = policy_body("inference", {"mode": "memory", "sliceSize": "10G", "allowFullGpu": True},
                        tenants=[{"namespace": "team-a"}, {"namespace": "team-b"}])
FULL = "full.inference.gpuslice.dev"
TURNED_AWAY = ("0/1 nodes are available: 1 cannot allocate all claims. preemption: 0/1 nodes are available: 1"
               " Preemption is not helpful for scheduling.")
OWNERS = {"rs": ("ReplicaSet", "web-1"), "sts": ("StatefulSet", "db"), "job": ("Job", "train"),
          "ds": ("DaemonSet", "agent"), "bare": None, "custom": ("LeaderWorkerSet", "lws")}


def owner_refs(kind: str, uid: str = "") -> list[Body]:
    owner = OWNERS[kind]
    return [] if owner is None else [{"kind": owner[0], "name": owner[1], "uid": f"owner-{owner[1]}",
                                      "controller": True}]


@dataclass
class Fleet:
    """One node of H100s with the inference policy (10G slices and the whole GPU)."""

    gpus: int = 4
    node: str = "n1"
    policies: list[Body] = field(default_factory=lambda: [INFERENCE])
    model: str = "h100-80gb"
    pods: list[Body] = field(default_factory=list)
    claims: list[Body] = field(default_factory=list)
    budgets: list[Body] = field(default_factory=list)
    namespaces: list[Body] = field(default_factory=list)
    slices: list[Body] = field(default_factory=list)
    serial: int = 0
    namespace_uids: dict[str, str] = field(default_factory=dict)
    ledgers: dict[tuple[str, str], Body] | None = field(default_factory=dict)  # None: unreadable
    node_taints: tuple[Body, ...] = ()

    def __post_init__(self) -> None:
        self.slices = published(self.node, self.model, self.gpus, self.policies)

    def device(self, gpu: int, what: str = "inference-10g") -> str:
        """The next free device whose name starts with the GPU's tag and ``what``."""
        prefix = f"{tag(self.node, self.model, gpu)}-{what}"
        taken = {r["device"] for c in self.claims for r in c["status"]["allocation"]["devices"]["results"]}
        names = sorted(d["name"] for s in self.slices for d in s["spec"].get("devices") or []
                       if d["name"].startswith(prefix))
        return next(n for n in names if n not in taken)

    def run(self, gpu: int, owner: str = "rs", namespace: str = "team-a", what: str = "inference-10g",
            labels: dict[str, str] | None = None, pod_meta: dict[str, Any] | None = None,
            shared_claim: bool = False) -> str:
        """A pod holding one device of ``gpu`` through a claim made for it; its name."""
        self.serial += 1
        name = f"{owner}-{self.serial}"
        uid = f"uid-{name}"
        claim_name = f"{name}-gpu"
        self.pods.append({"metadata": {"namespace": namespace, "name": name, "uid": uid,
                                       "ownerReferences": owner_refs(owner), "labels": labels or {"app": "web"},
                                       "creationTimestamp": "2026-12-01T00:00:00Z", **(pod_meta or {})},
                          "spec": {"nodeName": self.node, "resourceClaims": [{"name": "gpu",
                                                                              "resourceClaimTemplateName": "t"}]},
                          "status": {"phase": "Running", "resourceClaimStatuses": [
                              {"name": "gpu", "resourceClaimName": claim_name}]}})
        device = self.device(gpu, what)
        owners = [] if shared_claim else [{"kind": "Pod", "name": name, "uid": uid, "controller": True}]
        self.claims.append({
            "metadata": {"namespace": namespace, "name": claim_name, "uid": f"uid-{claim_name}",
                         "ownerReferences": owners},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "x"}}]}},
            "status": {"allocation": {"devices": {"results": [{"request": "gpu", "driver": "gpu.gpuslice.dev",
                                                               "pool": self.node, "device": device}]}},
                       "reservedFor": [{"resource": "pods", "name": name, "uid": uid}]}})
        return name

    def wait(self, name: str = "big", device_class: str = FULL, namespace: str = "team-a",
             created: str = "2026-12-01T01:00:00Z", said: str | None = TURNED_AWAY, gates: Sequence[str] = ()) -> str:
        """A pod waiting for a claim of ``device_class``; ``said``: the scheduler's message in its
        PodScheduled condition (None: not tried yet)."""
        claim_name = f"{name}-gpu"
        conditions = [] if said is None else [{"type": "PodScheduled", "status": "False",
                                               "reason": "Unschedulable", "message": said}]
        spec: dict[str, Any] = {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]}
        if gates:
            spec["schedulingGates"] = [{"name": g} for g in gates]
        self.pods.append({"metadata": {"namespace": namespace, "name": name, "uid": f"uid-{name}",
                                       "creationTimestamp": created},
                          "spec": spec,
                          "status": {"phase": "Pending", "conditions": conditions, "resourceClaimStatuses": [
                              {"name": "gpu", "resourceClaimName": claim_name}]}})
        self.claims.append({"metadata": {"namespace": namespace, "name": claim_name, "uid": f"uid-{claim_name}",
                                         "creationTimestamp": created,
                                         "ownerReferences": [{"kind": "Pod", "name": name, "uid": f"uid-{name}",
                                                              "controller": True}]},
                            "spec": {"devices": {"requests": [{"name": "gpu",
                                                               "exactly": {"deviceClassName": device_class}}]}}})
        return name

    def budget(self, name: str, allowed: int, labels: dict[str, str], namespace: str = "team-a") -> None:
        self.budgets.append({"metadata": {"namespace": namespace, "name": name, "generation": 1},
                             "spec": {"selector": {"matchLabels": labels}},
                             "status": {"observedGeneration": 1, "disruptionsAllowed": allowed}})

    def cluster(self, in_flight: Sequence[Any] = ()) -> Cluster:
        tenants = {p["metadata"]["name"]: frozenset(t["namespace"] for t in p["spec"].get("tenants") or [])
                   for p in self.policies}
        return Cluster(read_pools(self.slices, self.claims), [ClaimFacts.from_body(c) for c in self.claims],
                       [PodFacts.from_body(p) for p in self.pods],
                       [DisruptionBudget.from_body(b) for b in self.budgets], tenants,
                       opted_out_namespaces(self.namespaces),
                       {self.node: NodeFacts(self.node, {"kubernetes.io/hostname": self.node}, self.node_taints)},
                       tuple(in_flight))

    def plans(self) -> list[Plan]:
        cluster = self.cluster()
        return plan_defrag(cluster, waiting_pods(cluster.pods, cluster.claims, self.policies, self.namespace_uids,
                                                 self.ledgers))

    def gpu_uuid(self, index: int) -> str:
        return gpus(self.node, self.model, self.gpus)[index].uuid
