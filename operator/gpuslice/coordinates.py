"""Where everything gpuslice reads and writes lives on the API server: every REST path, in one module.

A path is a pure string built from a kind's group, version and plural, so this module sits at the
bottom layer beside ``jsontypes``: the pure core names paths too (``api.ledger``, ``api.agent_view``)
and may not import ``gpuslice.kube``, and every layer above can import from here. ``kube.paths``
re-exports the generic helpers for the client's callers. It also declares gpuslice's own API
group and version, which ``api.policy`` takes from here.

The kinds are known (``KINDS``), so no discovery is needed to build a path; the discovery paths
below are for asking whether an API is served. Label and field selectors are query parameters the
caller passes beside the path (``kube.list(SLICES, fieldSelector=...)``), never part of it. A
namespaced collection without a namespace is the collection across all namespaces.
"""

from __future__ import annotations

from gpuslice.jsontypes import Body

GROUP = "gpuslice.dev"
VERSION = "v1alpha1"
GPUSLICE = f"{GROUP}/{VERSION}"
POLICY_PLURAL = "gpuslicepolicies"
LEDGER_PLURAL = "gpusliceledgers"
VIEW_PLURAL = "gpusliceagentviews"

CORE = "v1"
RESOURCE = "resource.k8s.io/v1"
ADMISSION = "admissionregistration.k8s.io/v1"
RBAC = "rbac.authorization.k8s.io/v1"

# (apiVersion, kind) -> (plural, namespaced)
KINDS: dict[tuple[str, str], tuple[str, bool]] = {
    (CORE, "Namespace"): ("namespaces", False),
    (CORE, "Node"): ("nodes", False),
    (CORE, "Pod"): ("pods", True),
    (CORE, "ResourceQuota"): ("resourcequotas", True),
    (CORE, "Event"): ("events", True),
    (CORE, "ConfigMap"): ("configmaps", True),
    (CORE, "ServiceAccount"): ("serviceaccounts", True),
    (CORE, "Secret"): ("secrets", True),
    (CORE, "Service"): ("services", True),
    (RBAC, "ClusterRole"): ("clusterroles", False),
    (RBAC, "ClusterRoleBinding"): ("clusterrolebindings", False),
    (RBAC, "Role"): ("roles", True),
    (RBAC, "RoleBinding"): ("rolebindings", True),
    (RESOURCE, "DeviceClass"): ("deviceclasses", False),
    (RESOURCE, "ResourceClaimTemplate"): ("resourceclaimtemplates", True),
    (RESOURCE, "ResourceClaim"): ("resourceclaims", True),
    (RESOURCE, "ResourceSlice"): ("resourceslices", False),
    (RESOURCE, "DeviceTaintRule"): ("devicetaintrules", False),
    ("resource.k8s.io/v1beta2", "DeviceTaintRule"): ("devicetaintrules", False),
    (ADMISSION, "ValidatingAdmissionPolicy"): ("validatingadmissionpolicies", False),
    (ADMISSION, "ValidatingAdmissionPolicyBinding"): ("validatingadmissionpolicybindings", False),
    (ADMISSION, "ValidatingWebhookConfiguration"): ("validatingwebhookconfigurations", False),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"): ("customresourcedefinitions", False),
    ("authentication.k8s.io/v1", "SelfSubjectReview"): ("selfsubjectreviews", False),
    ("coordination.k8s.io/v1", "Lease"): ("leases", True),
    ("policy/v1", "PodDisruptionBudget"): ("poddisruptionbudgets", True),
    ("apps/v1", "ReplicaSet"): ("replicasets", True),
    (GPUSLICE, "GpuSlicePolicy"): (POLICY_PLURAL, False),
    (GPUSLICE, "GpuSliceLedger"): (LEDGER_PLURAL, True),
    (GPUSLICE, "GpuSliceAgentView"): (VIEW_PLURAL, True),
}


# Discovery.
APIS = "/apis"


def group_version_path(api_version: str) -> str:
    """The discovery document of one group version (``v1``: the core group's)."""
    return "/api/v1" if api_version == CORE else f"/apis/{api_version}"


# Any kind.
def collection(api_version: str, kind: str, namespace: str | None = None) -> str:
    """The collection path; for a namespaced kind without ``namespace``, across all namespaces."""
    plural, namespaced = KINDS[(api_version, kind)]
    if namespaced and namespace:
        return f"{group_version_path(api_version)}/namespaces/{namespace}/{plural}"
    return f"{group_version_path(api_version)}/{plural}"


def named(api_version: str, kind: str, name: str, namespace: str | None = None) -> str:
    return f"{collection(api_version, kind, namespace)}/{name}"


def object_path(manifest: Body) -> str:
    meta = manifest["metadata"]
    return named(manifest["apiVersion"], manifest["kind"], meta["name"], meta.get("namespace"))


# Cluster-wide collections (a namespaced kind's across all namespaces).
NAMESPACES = collection(CORE, "Namespace")
NODES = collection(CORE, "Node")
PODS = collection(CORE, "Pod")
EVENTS = collection(CORE, "Event")
SLICES = collection(RESOURCE, "ResourceSlice")
CLAIMS = collection(RESOURCE, "ResourceClaim")
DEVICE_CLASSES = collection(RESOURCE, "DeviceClass")
POLICIES = collection(GPUSLICE, "GpuSlicePolicy")
CRDS = collection("apiextensions.k8s.io/v1", "CustomResourceDefinition")
WEBHOOK_CONFIGURATIONS = collection(ADMISSION, "ValidatingWebhookConfiguration")
SELF_SUBJECT_REVIEWS = collection("authentication.k8s.io/v1", "SelfSubjectReview")


def device_taint_rules(version: str = "v1") -> str:
    """DeviceTaintRules in ``resource.k8s.io/<version>`` (v1 from Kubernetes 1.37, v1beta2 before)."""
    return collection(f"resource.k8s.io/{version}", "DeviceTaintRule")


# Collections in one namespace.
def pods_in(namespace: str) -> str:
    return collection(CORE, "Pod", namespace)


def events_in(namespace: str) -> str:
    return collection(CORE, "Event", namespace)


def configmaps_in(namespace: str) -> str:
    return collection(CORE, "ConfigMap", namespace)


def secrets_in(namespace: str) -> str:
    return collection(CORE, "Secret", namespace)


def service_accounts_in(namespace: str) -> str:
    return collection(CORE, "ServiceAccount", namespace)


def quotas_in(namespace: str) -> str:
    return collection(CORE, "ResourceQuota", namespace)


def claims_in(namespace: str) -> str:
    return collection(RESOURCE, "ResourceClaim", namespace)


def claim_templates_in(namespace: str) -> str:
    return collection(RESOURCE, "ResourceClaimTemplate", namespace)


def budgets_in(namespace: str) -> str:
    """PodDisruptionBudgets."""
    return collection("policy/v1", "PodDisruptionBudget", namespace)


def replicasets_in(namespace: str) -> str:
    return collection("apps/v1", "ReplicaSet", namespace)


def ledgers_in(home: str) -> str:
    """GpuSliceLedgers, in gpuslice's own namespace ``home``."""
    return collection(GPUSLICE, "GpuSliceLedger", home)


def views_in(home: str) -> str:
    """GpuSliceAgentViews, in gpuslice's own namespace ``home``."""
    return collection(GPUSLICE, "GpuSliceAgentView", home)


# Objects and their subresources.
def namespace_path(name: str) -> str:
    return named(CORE, "Namespace", name)


def node_path(name: str) -> str:
    return named(CORE, "Node", name)


def pod_path(namespace: str, name: str) -> str:
    return named(CORE, "Pod", name, namespace)


def eviction_path(namespace: str, pod: str) -> str:
    """The pod's eviction subresource: deleting through it honours PodDisruptionBudgets."""
    return f"{pod_path(namespace, pod)}/eviction"


def event_path(namespace: str, name: str) -> str:
    return named(CORE, "Event", name, namespace)


def configmap_path(namespace: str, name: str) -> str:
    return named(CORE, "ConfigMap", name, namespace)


def secret_path(namespace: str, name: str) -> str:
    return named(CORE, "Secret", name, namespace)


def quota_path(namespace: str, name: str) -> str:
    return named(CORE, "ResourceQuota", name, namespace)


def token_path(namespace: str, service_account: str) -> str:
    """The service account's token subresource (a TokenRequest is created there)."""
    return f"{named(CORE, 'ServiceAccount', service_account, namespace)}/token"


def lease_path(namespace: str, name: str) -> str:
    return named("coordination.k8s.io/v1", "Lease", name, namespace)


def slice_path(name: str) -> str:
    return named(RESOURCE, "ResourceSlice", name)


def claim_path(namespace: str, name: str) -> str:
    return named(RESOURCE, "ResourceClaim", name, namespace)


def claim_status_path(namespace: str, name: str) -> str:
    return f"{claim_path(namespace, name)}/status"


def claim_template_path(namespace: str, name: str) -> str:
    return named(RESOURCE, "ResourceClaimTemplate", name, namespace)


def device_class_path(name: str) -> str:
    return named(RESOURCE, "DeviceClass", name)


def admission_policy_path(name: str) -> str:
    """A ValidatingAdmissionPolicy."""
    return named(ADMISSION, "ValidatingAdmissionPolicy", name)


def admission_binding_path(name: str) -> str:
    """A ValidatingAdmissionPolicyBinding."""
    return named(ADMISSION, "ValidatingAdmissionPolicyBinding", name)


def webhook_configuration_path(name: str) -> str:
    """A ValidatingWebhookConfiguration."""
    return named(ADMISSION, "ValidatingWebhookConfiguration", name)


def crd_path(name: str) -> str:
    return named("apiextensions.k8s.io/v1", "CustomResourceDefinition", name)


def policy_path(name: str) -> str:
    return named(GPUSLICE, "GpuSlicePolicy", name)


def policy_status_path(name: str) -> str:
    return f"{policy_path(name)}/status"


def ledger_path(home: str, name: str) -> str:
    return named(GPUSLICE, "GpuSliceLedger", name, home)


def ledger_status_path(home: str, name: str) -> str:
    return f"{ledger_path(home, name)}/status"


def view_path(home: str, name: str) -> str:
    return named(GPUSLICE, "GpuSliceAgentView", name, home)
