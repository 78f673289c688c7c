"""The GpuSliceAgentView API: what a node agent plans from, of one GpuSlicePolicy.

Node agents watched the policies, so every write of a policy reached every agent: its status,
which the controller refreshes as claims come and go (its counts, conditions, tenants) and whose
size grows with the tenants and nodes, was sent to a thousand agents for each bound pod (421
bytes per agent per bound pod with one policy of 20 tenants), only for them to throw it away. So
the controller writes, beside each policy, the part of it an agent's planner reads, and agents
watch these views and never the policies:

- the policy's ``nodeSelector``, ``gpuSelector``, ``slicing`` and ``taints`` (no tenant, nothing
  that grows with them: a tenant added wakes no agent);
- its name, UID, generation, creation and deletion times (the older of two conflicting policies
  keeps its GPUs; a policy being deleted drains);
- the controller's verdict on that generation (``status.observedGeneration`` and the ``Valid``
  condition's status and reason), which it writes only once the tenancy rule is proved;
- the defragmentation moves in flight (the agent taints a GPU being freed).

A view changes only when one of these does: a spec edit, a verdict, a move; never for a bound
pod. It lives in gpuslice's own namespace (the ``namespace`` setting; agents read nothing else there
but their own drain object),
is named after its policy, and is owned by it (garbage-collected with it). Written by the
controller only; a field the planner comes to read must be added here (``view_of``).
"""

from __future__ import annotations

from typing import Any

from gpuslice import coordinates
from gpuslice.api.policy import GROUP, KIND, VERSION
from gpuslice.coordinates import VIEW_PLURAL as VIEW_PLURAL
from gpuslice.dra.names import CONTROLLER_NAMESPACE, LABEL_POLICY
from gpuslice.jsontypes import Body

VIEW_KIND = "GpuSliceAgentView"


def views_in(home: str = CONTROLLER_NAMESPACE) -> str:
    """The views' collection in gpuslice's namespace ``home``."""
    return coordinates.views_in(home)


VIEWS = views_in()
# What of a policy's spec the node agents' planner reads (publisher.sort_policies, planning.node).
PLANNED_SPEC = ("nodeSelector", "gpuSelector", "slicing", "taints")


def view_path(policy: str, home: str = CONTROLLER_NAMESPACE) -> str:
    return coordinates.view_path(home, policy)


def view_of(policy: Body, home: str = CONTROLLER_NAMESPACE) -> dict[str, Any]:
    """The view of ``policy`` (a GpuSlicePolicy as the API server has it) that the controller writes
    in its namespace ``home``."""
    meta, spec, status = policy.get("metadata") or {}, policy.get("spec") or {}, policy.get("status") or {}
    name = str(meta["name"])
    valid = next((c for c in status.get("conditions") or [] if c.get("type") == "Valid"), None)
    view: dict[str, Any] = {
        "policy": {k: meta[k] for k in ("uid", "generation", "creationTimestamp", "deletionTimestamp") if k in meta},
        "spec": {k: spec[k] for k in PLANNED_SPEC if k in spec},
    }
    if status.get("observedGeneration") is not None:
        view["observedGeneration"] = status["observedGeneration"]
    if valid is not None:
        view["valid"] = {"status": valid.get("status"), "reason": valid.get("reason", "")}
    moves = (status.get("defragmentation") or {}).get("inFlight") or []
    if moves:
        view["inFlight"] = list(moves)
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": VIEW_KIND,
        "metadata": {"name": name, "namespace": home,
                     "labels": {LABEL_POLICY: name, "app.kubernetes.io/managed-by": "gpuslice"},
                     "ownerReferences": [{"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": name,
                                          "uid": meta.get("uid", ""), "blockOwnerDeletion": False}]},
        "spec": view,
    }


def policy_of(view: Body) -> dict[str, Any]:
    """The policy as the agent's planner reads it, rebuilt from its view: its ``resourceVersion``
    is the view's (what the agent's parse cache is keyed by)."""
    meta, spec = view.get("metadata") or {}, view.get("spec") or {}
    policy = {k: v for k, v in (spec.get("policy") or {}).items() if v is not None}
    status: dict[str, Any] = {}
    if spec.get("observedGeneration") is not None:
        status["observedGeneration"] = spec["observedGeneration"]
    if spec.get("valid"):
        status["conditions"] = [{"type": "Valid", **spec["valid"]}]
    if spec.get("inFlight"):
        status["defragmentation"] = {"inFlight": list(spec["inFlight"])}
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
        "metadata": {"name": meta.get("name"), **({"resourceVersion": meta["resourceVersion"]}
                                                   if meta.get("resourceVersion") else {}), **policy},
        "spec": dict(spec.get("spec") or {}), "status": status,
    }
