"""The controller's Kopf indexes: what it keeps in memory of what it watches.

Kopf watches policies, namespaces, nodes, our ResourceSlices, the ResourceClaims and the pods not
yet on a node (``PENDING_PODS``: selected by the API server), and keeps in-memory indexes of what
it saw, so a reconcile reads the cluster from memory (:func:`world`)
and only writes. Foreign objects are only indexed or observed: no timer, daemon or finalizer ever
touches them. Kopf runs index handlers in a thread before it stores what they return, so they
note nothing: the event handlers that run after them do (controller.changes says why).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import kopf

from gpuslice.api.agent_view import VIEW_PLURAL
from gpuslice.api.ledger import LEDGER_PLURAL
from gpuslice.api.policy import GROUP, PLURAL, VERSION
from gpuslice.api.resource import GpuSlicePolicy, valid_policy
from gpuslice.controller.admin_access import NamespaceView
from gpuslice.controller.apply import APPLIED
from gpuslice.controller.overuse import Policies
from gpuslice.controller.tenancy import LedgerView, QuotaView
from gpuslice.controller.world import FleetMemo, World
from gpuslice.dra.names import CONTROLLER_NAMESPACE, DRIVER, LABEL_POLICY
from gpuslice.dra.wire import pool_mark
from gpuslice.planning.node.coexistence import other_driver_gpus
from gpuslice.planning.reads.node_fit import NodeFacts
from gpuslice.planning.reads.published import own_pool
from gpuslice.planning.reads.usage import ClaimView, SliceView, slice_policies

POLICY = (GROUP, VERSION, PLURAL)
SLICES = ("resource.k8s.io", "v1", "resourceslices")
PODS = ("v1", "pods")
# The only pods the controller watches: those not yet on a node, selected by the API server (its
# watch cache keeps pods by spec.nodeName), so a pod sends events from its creation until it is
# bound (then one that it is gone from the selection), and none while it runs.
PENDING_PODS = "spec.nodeName="


def other_driver(spec: kopf.Spec, **_: Any) -> bool:
    """A slice of another DRA driver on a node (it may name GPUs: planning.node.coexistence)."""
    return spec.get("driver") != DRIVER and bool(spec.get("nodeName"))


def ours(spec: kopf.Spec, **_: Any) -> bool:
    return own_pool(spec)


def _values(index: Any) -> list[Any]:
    return [value for store in index.values() for value in store]


def _one_per_key(index: Any) -> dict[Any, Any]:
    return {key: value for key, store in index.items() for value in store}


def world(kwargs: dict[str, Any], memo: FleetMemo | None = None, nodes_version: int | None = None) -> World:
    return World(
        policies=_one_per_key(kwargs["policy_index"]),
        live_policies=lambda: _one_per_key(kwargs["policy_index"]),
        namespaces=_one_per_key(kwargs["namespace_index"]),
        nodes=_one_per_key(kwargs["node_index"]),
        slices=_values(kwargs["slice_index"]),
        claims=[c for c in _values(kwargs["claim_index"]) if c is not None],
        foreign_classes={k: v for k, v in _one_per_key(kwargs["class_index"]).items() if v is not False},
        quotas=_one_per_key(kwargs["quota_index"]),
        ledgers=_one_per_key(kwargs["ledger_index"]),
        slice_pools=kwargs["slice_index"],
        policy_pools=kwargs["policy_pool_index"],
        parsed=_one_per_key(kwargs["parsed_index"]),
        nodes_version=nodes_version,
        memo=memo,
        other_drivers={node: list(store) for node, store in kwargs["other_driver_index"].items()},
        owned=OwnedObjects(kwargs),
    )


def overuse_policies(kwargs: dict[str, Any]) -> Policies:
    """A device's policy as its slice publishes it, and what that policy says about overuse."""
    slices, bodies = kwargs["slice_index"], kwargs["policy_index"]

    def policy_of(pool: str, device: str) -> str | None:
        return next((policy or None for view in slices.get(pool, ()) for name, policy in view.devices
                     if name == device), None)

    def on_overuse(policy: str) -> str:
        return next((str((body.get("spec") or {}).get("onOveruse") or "Report") for body in bodies.get(policy, ())),
                    "Report")

    return Policies(policy_of, on_overuse)


def class_value(labels: kopf.Labels, spec: kopf.Spec) -> str | bool | None:
    """A DeviceClass's extended resource; False for one of ours (only others' can conflict)."""
    return False if LABEL_POLICY in labels else spec.get("extendedResourceName")


def policy_index(name: str, body: kopf.Body, **_: Any) -> dict[str, Any]:
    return {name: dict(body)}


def parsed_index(name: str, body: kopf.Body, **_: Any) -> dict[str, GpuSlicePolicy | None]:
    """Each policy parsed once per change: every reconcile judges it against all the others."""
    return {name: valid_policy(body)}


def namespace_index(name: str, labels: kopf.Labels, uid: str | None, status: kopf.Status, meta: kopf.Meta,
                    **_: Any) -> dict[str, NamespaceView]:
    """What changed is noted by namespace_event, once this index holds it (changes.py says why)."""
    return {name: NamespaceView.from_namespace(labels, uid, status, meta.get("resourceVersion"))}


def class_index(name: str, labels: kopf.Labels, spec: kopf.Spec, **_: Any) -> dict[str, str | bool | None]:
    """DeviceClasses gpuslice did not make, with their extended resource (ours map to False)."""
    return {name: class_value(labels, spec)}


def quota_index(namespace: str | None, name: str, labels: kopf.Labels, meta: kopf.Meta, status: kopf.Status,
                **_: Any) -> dict[tuple[str, str], QuotaView]:
    return {(namespace or "", name): QuotaView.from_quota(labels[LABEL_POLICY], meta, status)}


def ledger_index(name: str, spec: kopf.Spec, status: kopf.Status, **_: Any) -> dict[str, LedgerView]:
    return {name: LedgerView.from_ledger(spec, status)}


def node_index(name: str, labels: kopf.Labels, **_: Any) -> dict[str, dict[str, str]]:
    return {name: dict(labels)}


def slice_index(spec: kopf.Spec, annotations: kopf.Annotations, **_: Any) -> dict[str, SliceView]:
    """Our slices by pool (a Store holds each of a pool's slices). What changed is noted by
    slice_event, which Kopf runs after this index is updated, for every event."""
    view = SliceView.from_slice(spec, annotations)
    return {view.pool: view}


def policy_pool_index(spec: kopf.Spec, annotations: kopf.Annotations, **_: Any) -> dict[str, str]:
    """The pool of each slice, under every policy it publishes devices of or leaves out."""
    pool = pool_mark(spec)[0]
    return {policy: pool for policy in slice_policies(spec, annotations)}


def other_driver_index(spec: kopf.Spec, **_: Any) -> dict[str, tuple[str, int]]:
    """Other drivers' slices that name GPUs, by node (planning.node.coexistence)."""
    found = other_driver_gpus(spec)
    return {str(spec["nodeName"]): (found.driver, found.gpu_devices)} if found.gpu_devices else {}


def node_facts_index(name: str, body: kopf.Body, **_: Any) -> dict[str, NodeFacts]:
    """What a pod's placement is judged against: the node's labels and its scheduling taints."""
    return {name: NodeFacts.from_body(body)}


def claiming(spec: kopf.Spec, **_: Any) -> bool:
    """A pod with claims (only such a pod can wait for devices)."""
    return bool(spec.get("resourceClaims"))


def pending_pod_index(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> dict[tuple[str, str], Any]:
    """A pod not yet on a node, with what the scheduler retry and the defragmenter read of it."""
    return {(namespace or "", name): pending_pod(body)}


def pending_pod(body: Any) -> dict[str, Any]:
    """What is kept of a pod not yet on a node: its identity, claims, placement and the scheduler's
    last word (the rest of a pod, its containers, is not kept)."""
    meta, spec, status = body.get("metadata") or {}, body.get("spec") or {}, body.get("status") or {}
    return {
        "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp")
                     if k in meta},
        "spec": {k: spec[k] for k in ("nodeName", "resourceClaims", "nodeSelector", "affinity", "tolerations",
                                          "schedulingGates") if k in spec},
        "status": {"phase": status.get("phase", "Pending"),
                   "conditions": [c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"],
                   "resourceClaimStatuses": status.get("resourceClaimStatuses") or []},
    }


def pending_pods(kwargs: dict[str, Any]) -> list[dict[str, Any]]:
    return _values(kwargs["pending_pod_index"])


def node_facts(kwargs: dict[str, Any]) -> dict[str, NodeFacts]:
    return _one_per_key(kwargs["node_facts_index"])


# The kinds a policy owns, each watched for its objects (labelled with their policy): a converge,
# and so the drift repair every 120 s, compares what it wants with these instead of listing.
OWNED = {
    "owned_class_index": ("resource.k8s.io", "v1", "deviceclasses"),
    "owned_quota_index": ("v1", "resourcequotas"),
    "owned_template_index": ("resource.k8s.io", "v1", "resourceclaimtemplates"),
    "owned_ledger_index": (GROUP, VERSION, LEDGER_PLURAL),
}


def owned_index(labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict[str, dict[str, Any]]:
    """One of a policy's objects, by its policy: what a converge compares with what it wants."""
    meta = body.get("metadata") or {}
    kept = {k: meta[k] for k in ("name", "namespace", "labels", "annotations", "ownerReferences", "resourceVersion")
            if k in meta}
    return {str(labels[LABEL_POLICY]): {"apiVersion": body.get("apiVersion"), "kind": body.get("kind"),
                                         "metadata": kept, "spec": body.get("spec")}}


class OwnedObjects(Mapping[str, list[dict[str, Any]]]):
    """Each policy's objects of the owned kinds, as the watches hold them when asked (Kopf's indexes
    are live): a converge that waited for the policy's lock sees what the one before it wrote, not
    what its handler saw when it began."""

    def __init__(self, kwargs: dict[str, Any]) -> None:
        self.indexes = [kwargs[index] for index in OWNED]

    def __getitem__(self, policy: str) -> list[dict[str, Any]]:
        return [body for index in self.indexes for body in index.get(policy, ())]

    def __iter__(self) -> Iterator[str]:
        return iter({policy for index in self.indexes for policy in index})

    def __len__(self) -> int:
        return len(set(self))


def view_index(namespace: str | None, name: str, annotations: kopf.Annotations,
               **_: Any) -> dict[tuple[str, str], str | None]:
    """Every agent view, by namespace and name, with the digest of what was last applied to it
    (controller.agent_views); :func:`views` keeps those in gpuslice's namespace."""
    return {(namespace or "", name): annotations.get(APPLIED)}


def views(kwargs: dict[str, Any], home: str = CONTROLLER_NAMESPACE) -> dict[str, str | None]:
    """Each policy's agent view in gpuslice's namespace ``home``, the ones agents read: one of the
    same name elsewhere is not it."""
    return {name: digest for (namespace, name), digest in _one_per_key(kwargs["view_index"]).items()
            if namespace == home}


def claim_index(namespace: str | None, name: str, status: kopf.Status, **_: Any) -> dict[tuple[str, str], Any]:
    return {(namespace or "", name): ClaimView.from_claim(namespace or "", name, status)}


def register_indexes(registry: kopf.OperatorRegistry) -> None:
    """Every index :func:`world` reads, by the id it reads it under."""
    kopf.index(*POLICY, registry=registry, id="policy_index")(policy_index)
    kopf.index(*POLICY, registry=registry, id="parsed_index")(parsed_index)
    kopf.index("v1", "namespaces", registry=registry, id="namespace_index")(namespace_index)
    kopf.index("resource.k8s.io", "v1", "deviceclasses", registry=registry, id="class_index")(class_index)
    kopf.index("v1", "resourcequotas", registry=registry, id="quota_index",
               labels={LABEL_POLICY: kopf.PRESENT})(quota_index)
    kopf.index(GROUP, VERSION, LEDGER_PLURAL, registry=registry, id="ledger_index")(ledger_index)
    kopf.index("v1", "nodes", registry=registry, id="node_index")(node_index)
    kopf.index("v1", "nodes", registry=registry, id="node_facts_index")(node_facts_index)
    kopf.index(*PODS, registry=registry, id="pending_pod_index", when=claiming)(pending_pod_index)
    kopf.index(*SLICES, registry=registry, id="slice_index", when=ours)(slice_index)
    kopf.index(*SLICES, registry=registry, id="policy_pool_index", when=ours)(policy_pool_index)
    kopf.index(*SLICES, registry=registry, id="other_driver_index", when=other_driver)(other_driver_index)
    kopf.index("resource.k8s.io", "v1", "resourceclaims", registry=registry, id="claim_index")(claim_index)
    kopf.index(GROUP, VERSION, VIEW_PLURAL, registry=registry, id="view_index")(view_index)
    for index, resource in OWNED.items():
        kopf.index(*resource, registry=registry, id=index, labels={LABEL_POLICY: kopf.PRESENT})(owned_index)
