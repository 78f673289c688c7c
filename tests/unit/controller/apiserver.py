"""What the controller meets on a real API server, on the fake one (tests.fakeapi): the admission
rules of manifests/admission.yaml that its requests depend on, and the World its watches would give
it, read from what the server stores."""

from __future__ import annotations

from typing import Any

from gpuslice.controller.admin_access import NamespaceView
from gpuslice.controller.world import World
from gpuslice.dra.names import LABEL_POLICY
from gpuslice.planning.cluster.tenancy_rule import NON_TENANTS, TENANCY, TENANCY_DENIAL
from tests import builders
from tests.fakeapi import FakeApi, Refusal, Request

ADMISSION = "/apis/admissionregistration.k8s.io/v1"
OWNED = ("deviceclasses", "resourcequotas", "resourceclaimtemplates", "devicetaintrules")
WATCHED = ("/apis/resource.k8s.io/v1/deviceclasses", "/api/v1/resourcequotas",
           "/apis/resource.k8s.io/v1/resourceclaimtemplates", "/apis/gpuslice.dev/v1alpha1/gpusliceledgers")


def enforce_tenancy(api: FakeApi) -> None:
    """Install ``gpuslice-tenancy`` and ``gpuslice-non-tenants``: the controller's dry-run probe
    claim, from its own namespace, is refused as no tenant's."""
    api.put({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
             "metadata": {"name": NON_TENANTS}, "spec": {}},
            {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
             "metadata": {"name": NON_TENANTS}, "spec": {"policyName": NON_TENANTS, "validationActions": ["Deny"]}})

    def tenancy(request: Request, obj: dict[str, Any] | None) -> Refusal | None:
        if request.method != "POST" or obj is None or obj.get("kind") != "ResourceClaim":
            return None
        namespace = request.path.split("/")[5]
        klass = obj["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"]
        policy = klass.removesuffix(".gpuslice.dev")
        body = api.get(f"{builders.POLICIES}/{policy}")
        tenants = {t["namespace"] for t in ((body or {}).get("spec") or {}).get("tenants") or []}
        if namespace in tenants:
            return None
        return Refusal(403, f'resourceclaims.resource.k8s.io "{obj["metadata"]["name"]}" is forbidden:'
                            f" ValidatingAdmissionPolicy '{TENANCY}' with binding '{TENANCY}' denied request:"
                            f" claim {namespace}/{obj['metadata']['name']}: namespace {namespace} {TENANCY_DENIAL}"
                            f" {policy}, so it may not use its devices")

    api.admit(tenancy)


def own_objects_only(api: FakeApi) -> None:
    """``gpuslice-controller-writes``: the controller may write only objects labelled as a policy's
    (a tenant's own template of the same name is not its to overwrite)."""
    def rule(request: Request, obj: dict[str, Any] | None) -> Refusal | None:
        kind = next((k for k in OWNED if f"/{k}" in request.path), None)
        if request.method == "GET" or kind is None:
            return None
        old = api.get(request.path) if request.method != "POST" else None
        for body in (obj, old):
            if body is not None and not (body["metadata"].get("labels") or {}).get(LABEL_POLICY):
                return Refusal(403, f'{kind} "{body["metadata"]["name"]}" is forbidden: ValidatingAdmissionPolicy'
                                    " 'gpuslice-controller-writes' denied request: the gpuslice controller may write"
                                    f" only objects labelled {LABEL_POLICY} and app.kubernetes.io/managed-by=gpuslice")
        return None

    api.admit(rule)


def world(api: FakeApi) -> World:
    """The controller's World as its watches would have it: the policies, namespaces and nodes the
    server stores (no slices, no claims: no agent has published)."""
    namespaces = {n["metadata"]["name"]: NamespaceView.from_namespace(
        n["metadata"].get("labels") or {}, n["metadata"].get("uid"), n.get("status") or {})
        for n in api.items("/api/v1/namespaces")}
    nodes = {n["metadata"]["name"]: n["metadata"].get("labels") or {} for n in api.items("/api/v1/nodes")}
    policies = {p["metadata"]["name"]: p for p in api.items(builders.POLICIES)}
    return World(policies=policies, namespaces=namespaces, nodes=nodes, slices=[], claims=[], owned=owned(api))


def owned(api: FakeApi) -> dict[str, list[dict[str, Any]]]:
    """Each policy's objects of the kinds the controller watches (controller.indexes.OWNED), as its
    watches would hold them."""
    found: dict[str, list[dict[str, Any]]] = {}
    for collection in WATCHED:
        for obj in api.items(collection):
            policy = (obj["metadata"].get("labels") or {}).get(LABEL_POLICY)
            if policy:
                found.setdefault(policy, []).append(obj)
    return found
