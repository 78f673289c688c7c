"""Every REST path gpuslice uses comes from gpuslice.coordinates: each helper gives, byte for byte, the
literal it replaced, and no module of the package writes a path of its own."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from gpuslice import coordinates as c
from gpuslice.api import agent_view, ledger, policy
from gpuslice.kube import paths

PACKAGE = Path(c.__file__).resolve().parent
# A path's markers in a string: an API root, a namespace segment, a plural of a kind we know, or a
# subresource suffix (``f"{path}/status"``).
PLURALS = "|".join(sorted({plural for plural, _ in c.KINDS.values()}))
PATH = re.compile(rf"(?<![\w.])/apis?(/|$)|/namespaces/|/({PLURALS})(/|$)|^(\{{\}})?/(status|eviction|token)$")
# (module, the string as the guard reads it) -> why it is not a REST path.
ALLOWED: dict[tuple[str, str], str] = {
    ("kube/kubeconfig.py", "/var/run/secrets/kubernetes.io/serviceaccount"):
        "the in-cluster service account's mount: a file path on the pod, not a REST path",
}


@pytest.mark.parametrize(("built", "literal"), [
    (c.APIS, "/apis"),
    (c.group_version_path("v1"), "/api/v1"),
    (c.group_version_path("gpuslice.dev/v1alpha1"), "/apis/gpuslice.dev/v1alpha1"),
    (c.group_version_path(c.GPUSLICE), "/apis/gpuslice.dev/v1alpha1"),
    (c.NAMESPACES, "/api/v1/namespaces"),
    (c.NODES, "/api/v1/nodes"),
    (c.PODS, "/api/v1/pods"),
    (c.EVENTS, "/api/v1/events"),
    (c.SLICES, "/apis/resource.k8s.io/v1/resourceslices"),
    (c.CLAIMS, "/apis/resource.k8s.io/v1/resourceclaims"),
    (c.DEVICE_CLASSES, "/apis/resource.k8s.io/v1/deviceclasses"),
    (c.POLICIES, "/apis/gpuslice.dev/v1alpha1/gpuslicepolicies"),
    (c.CRDS, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"),
    (c.WEBHOOK_CONFIGURATIONS, "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"),
    (c.SELF_SUBJECT_REVIEWS, "/apis/authentication.k8s.io/v1/selfsubjectreviews"),
    (c.device_taint_rules(), "/apis/resource.k8s.io/v1/devicetaintrules"),
    (c.device_taint_rules("v1beta2"), "/apis/resource.k8s.io/v1beta2/devicetaintrules"),
    (c.pods_in("ns"), "/api/v1/namespaces/ns/pods"),
    (c.events_in("ns"), "/api/v1/namespaces/ns/events"),
    (c.configmaps_in("ns"), "/api/v1/namespaces/ns/configmaps"),
    (c.secrets_in("ns"), "/api/v1/namespaces/ns/secrets"),
    (c.service_accounts_in("ns"), "/api/v1/namespaces/ns/serviceaccounts"),
    (c.quotas_in("ns"), "/api/v1/namespaces/ns/resourcequotas"),
    (c.claims_in("ns"), "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims"),
    (c.claim_templates_in("ns"), "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaimtemplates"),
    (c.budgets_in("ns"), "/apis/policy/v1/namespaces/ns/poddisruptionbudgets"),
    (c.replicasets_in("ns"), "/apis/apps/v1/namespaces/ns/replicasets"),
    (c.ledgers_in("home"), "/apis/gpuslice.dev/v1alpha1/namespaces/home/gpusliceledgers"),
    (c.views_in("home"), "/apis/gpuslice.dev/v1alpha1/namespaces/home/gpusliceagentviews"),
    (c.namespace_path("ns"), "/api/v1/namespaces/ns"),
    (c.node_path("n1"), "/api/v1/nodes/n1"),
    (c.pod_path("ns", "p"), "/api/v1/namespaces/ns/pods/p"),
    (c.eviction_path("ns", "p"), "/api/v1/namespaces/ns/pods/p/eviction"),
    (c.event_path("ns", "e"), "/api/v1/namespaces/ns/events/e"),
    (c.configmap_path("ns", "m"), "/api/v1/namespaces/ns/configmaps/m"),
    (c.secret_path("ns", "s"), "/api/v1/namespaces/ns/secrets/s"),
    (c.quota_path("ns", "q"), "/api/v1/namespaces/ns/resourcequotas/q"),
    (c.token_path("ns", "sa"), "/api/v1/namespaces/ns/serviceaccounts/sa/token"),
    (c.lease_path("kube-node-lease", "n1"), "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1"),
    (c.slice_path("s"), "/apis/resource.k8s.io/v1/resourceslices/s"),
    (c.claim_path("ns", "cl"), "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/cl"),
    (c.claim_status_path("ns", "cl"), "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/cl/status"),
    (c.claim_template_path("ns", "t"), "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaimtemplates/t"),
    (c.device_class_path("d"), "/apis/resource.k8s.io/v1/deviceclasses/d"),
    (c.admission_policy_path("a"), "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/a"),
    (c.admission_binding_path("a"), "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings/a"),
    (c.webhook_configuration_path("w"), "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/w"),
    (c.crd_path("gpuslicepolicies.gpuslice.dev"),
     "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/gpuslicepolicies.gpuslice.dev"),
    (c.policy_path("p"), "/apis/gpuslice.dev/v1alpha1/gpuslicepolicies/p"),
    (c.policy_status_path("p"), "/apis/gpuslice.dev/v1alpha1/gpuslicepolicies/p/status"),
    (c.ledger_path("home", "l"), "/apis/gpuslice.dev/v1alpha1/namespaces/home/gpusliceledgers/l"),
    (c.ledger_status_path("home", "l"), "/apis/gpuslice.dev/v1alpha1/namespaces/home/gpusliceledgers/l/status"),
    (c.view_path("home", "v"), "/apis/gpuslice.dev/v1alpha1/namespaces/home/gpusliceagentviews/v"),
    (ledger.ledgers("home"), "/apis/gpuslice.dev/v1alpha1/namespaces/home/gpusliceledgers"),
    (ledger.ledger_path("p", "ns", "home"), "/apis/gpuslice.dev/v1alpha1/namespaces/home/gpusliceledgers/p.ns"),
    (ledger.ledger_status_path("p", "ns", "home"),
     "/apis/gpuslice.dev/v1alpha1/namespaces/home/gpusliceledgers/p.ns/status"),
    (agent_view.VIEWS, "/apis/gpuslice.dev/v1alpha1/namespaces/gpuslice-system/gpusliceagentviews"),
    (agent_view.view_path("p", "home"), "/apis/gpuslice.dev/v1alpha1/namespaces/home/gpusliceagentviews/p"),
])
def test_each_helper_gives_the_literal_it_replaced(built: str, literal: str) -> None:
    assert built == literal


def test_any_kind_by_version_and_kind() -> None:
    assert c.collection("v1", "ConfigMap") == "/api/v1/configmaps"
    assert c.collection("v1", "ConfigMap", "ns") == "/api/v1/namespaces/ns/configmaps"
    assert c.collection("rbac.authorization.k8s.io/v1", "ClusterRole", "ns") == \
        "/apis/rbac.authorization.k8s.io/v1/clusterroles"  # cluster-scoped: the namespace is ignored
    assert c.named("v1", "Service", "svc", "ns") == "/api/v1/namespaces/ns/services/svc"
    assert c.object_path({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "d"}}) == \
        "/apis/resource.k8s.io/v1/deviceclasses/d"
    assert c.object_path({"apiVersion": "v1", "kind": "ResourceQuota",
                          "metadata": {"name": "q", "namespace": "ns"}}) == "/api/v1/namespaces/ns/resourcequotas/q"
    with pytest.raises(KeyError):
        c.collection("v1", "NoSuchKind")


def test_the_api_group_is_declared_once() -> None:
    assert (policy.GROUP, policy.VERSION, policy.PLURAL) == ("gpuslice.dev", "v1alpha1", "gpuslicepolicies")
    assert (ledger.LEDGER_PLURAL, agent_view.VIEW_PLURAL) == ("gpusliceledgers", "gpusliceagentviews")
    assert (paths.KINDS, paths.collection, paths.object_path) == (c.KINDS, c.collection, c.object_path)


def _strings(tree: ast.Module) -> list[tuple[int, str]]:
    """The module's string literals, an f-string's fields read as ``{}``; docstrings left out."""
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    inner = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings | inner:
            found.append((node.lineno, node.value))
        elif isinstance(node, ast.JoinedStr):
            found.append((node.lineno, "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)))
    return found


def test_no_module_writes_a_rest_path_of_its_own() -> None:
    written = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        if module == "coordinates.py" or "/proto/" in module:
            continue
        written += [f"operator/gpuslice/{module}:{line}: {text!r}" for line, text in _strings(ast.parse(path.read_text()))
                    if PATH.search(text) and (module, text) not in ALLOWED]
    assert not written, "build these paths with gpuslice.coordinates:\n" + "\n".join(written)


@pytest.mark.parametrize("text", [
    "/api/v1/nodes", "/apis", "/apis/resource.k8s.io/v1", "{}/namespaces/{}/resourceclaims", "{}/resourceslices",
    "{}/status", "/status", "{}/eviction", "{}/apis/x",
])
def test_the_guard_sees_a_path(text: str) -> None:
    assert PATH.search(text)


@pytest.mark.parametrize("text", [
    "/proc/{}/status", "resourceclaims/status", "pods/eviction", "https://example.com/apis-docs", "/var/run/cdi",
])
def test_the_guard_passes_what_is_no_rest_path(text: str) -> None:
    assert not PATH.search(text)
