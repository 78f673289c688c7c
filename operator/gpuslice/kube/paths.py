"""REST paths of the kinds gpuslice manages (no discovery needed for these)."""

from __future__ import annotations

from typing import Any

# (apiVersion, kind) -> (plural, namespaced)
KINDS: dict[tuple[str, str], tuple[str, bool]] = {
    ("v1", "Namespace"): ("namespaces", False),
    ("v1", "Node"): ("nodes", False),
    ("v1", "ResourceQuota"): ("resourcequotas", True),
    ("v1", "Event"): ("events", True),
    ("v1", "ConfigMap"): ("configmaps", True),
    ("v1", "ServiceAccount"): ("serviceaccounts", True),
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): ("clusterroles", False),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): ("clusterrolebindings", False),
    ("rbac.authorization.k8s.io/v1", "Role"): ("roles", True),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): ("rolebindings", True),
    ("resource.k8s.io/v1", "DeviceClass"): ("deviceclasses", False),
    ("resource.k8s.io/v1", "ResourceClaimTemplate"): ("resourceclaimtemplates", True),
    ("resource.k8s.io/v1", "ResourceClaim"): ("resourceclaims", True),
    ("resource.k8s.io/v1", "ResourceSlice"): ("resourceslices", False),
    ("resource.k8s.io/v1", "DeviceTaintRule"): ("devicetaintrules", False),
    ("resource.k8s.io/v1beta2", "DeviceTaintRule"): ("devicetaintrules", False),
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"): ("validatingadmissionpolicies", False),
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding"):
        ("validatingadmissionpolicybindings", False),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"): ("customresourcedefinitions", False),
    ("gpuslice.dev/v1alpha1", "GpuSlicePolicy"): ("gpuslicepolicies", False),
    ("gpuslice.dev/v1alpha1", "GpuSliceLedger"): ("gpusliceledgers", True),
    ("gpuslice.dev/v1alpha1", "GpuSliceAgentView"): ("gpusliceagentviews", True),
    ("v1", "Secret"): ("secrets", True),
    ("v1", "Service"): ("services", True),
    ("policy/v1", "PodDisruptionBudget"): ("poddisruptionbudgets", True),
    ("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration"): ("validatingwebhookconfigurations", False),
}


def collection(api_version: str, kind: str, namespace: str | None = None) -> str:
    """The collection path; for a namespaced kind without ``namespace``, across all namespaces."""
    plural, namespaced = KINDS[(api_version, kind)]
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    if namespaced and namespace:
        return f"{prefix}/namespaces/{namespace}/{plural}"
    return f"{prefix}/{plural}"


def object_path(manifest: dict[str, Any]) -> str:
    meta = manifest["metadata"]
    return f"{collection(manifest['apiVersion'], manifest['kind'], meta.get('namespace'))}/{meta['name']}"
