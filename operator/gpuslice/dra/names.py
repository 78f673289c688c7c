"""Names gpuslice gives things in resource.k8s.io, in one place."""

from __future__ import annotations

import hashlib

DRIVER = "gpu.gpuslice.dev"
ATTRIBUTE_DOMAIN = "gpuslice.dev"
ATTR_POLICY = "policy"  # every device carries the name of the policy that made it

MANAGED_BY = {"app.kubernetes.io/managed-by": "gpuslice"}
LABEL_POLICY = "gpuslice.dev/policy"
ADMIN_ACCESS_LABEL = "resource.kubernetes.io/admin-access"
# Where the controller runs, and the one namespace that can never be a tenant: the controller
# proves that tenancy is enforced by being refused a (dry-run) claim there. The default of the
# processes' `namespace` setting (gpuslice.settings), which the chart and manifests set from the pod;
# the generated manifests (kustomize) use it, the chart templates it with the release's namespace.
CONTROLLER_NAMESPACE = "gpuslice-system"
# The namespaces whose claims of gpuslice's DeviceClasses the tenancy rule judges against every
# GpuSlicePolicy (its parameters) carry this label: those some policy names, and the controller's
# own. Everywhere else a rule without parameters refuses them (planning.cluster.tenancy_rule says why).
TENANCY_LABEL = "gpuslice.dev/tenancy"
TENANCY_JUDGED = "judged"
# Taints the node agent puts on devices to keep new claims off them (a held change, a drain,
# MIG reconfiguration, health). Tenants may never tolerate these, nor any other gpuslice.dev/ key
# that is not one of their policy's own tolerable taints.
PENDING_TAINT_KEY = "gpuslice.dev/pending-change"  # an allocated device keeps its old shape (pool_safety)
RECONFIGURING_TAINT_KEY = "gpuslice.dev/reconfiguring"  # the GPU's MIG layout is about to change
UNHEALTHY_TAINT_KEY = "gpuslice.dev/unhealthy"  # the GPU reported a fault (planning.node.health)
MIG_FAILED_TAINT_KEY = "gpuslice.dev/mig-failed"  # a MIG reconfiguration failed and was rolled back
# A GPU being freed for a waiting pod (defragmentation): on its devices but the one the pod gets.
DEFRAG_TAINT_KEY = "gpuslice.dev/defrag"
SAFETY_TAINT_KEYS = (PENDING_TAINT_KEY, RECONFIGURING_TAINT_KEY, UNHEALTHY_TAINT_KEY, MIG_FAILED_TAINT_KEY,
                     DEFRAG_TAINT_KEY)
# A pod or namespace labelled or annotated so is never moved to free a GPU.
DEFRAG_OPT_OUT = DEFRAG_TAINT_KEY


def device_class_name(policy: str) -> str:
    return f"{policy}.{ATTRIBUTE_DOMAIN}"


def quota_resource(device_class: str) -> str:
    """The ResourceQuota key that counts devices of a class (DRA quota)."""
    return f"{device_class}.deviceclass.resource.k8s.io/devices"


def short_hash(*parts: str, length: int = 10) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:length]


# maxMemory. A namespace that is a maxMemory tenant of some policy carries this label (as does the
# controller's own, for its probe): the webhook's namespaceSelector, so only their claims reach it.
# Like the tenancy label it only routes: the tenancy rule refuses a maxMemory tenant's claims in a
# namespace without it, so taking it off stops no check.
MEMORY_LABEL = "gpuslice.dev/memory-limit"
MEMORY_JUDGED = "judged"
MEMORY_WEBHOOK = "maxmemory.gpuslice.dev"  # the webhook's name, as the API server's messages quote it
MEMORY_WEBHOOK_CONFIG = "gpuslice-memory"  # its ValidatingWebhookConfiguration
MEMORY_WEBHOOK_PATH = "/validate/maxmemory"
MEMORY_WEBHOOK_SERVICE = "gpuslice-webhook"
MEMORY_WEBHOOK_TLS = "gpuslice-webhook-tls"  # Secret (tls.crt, tls.key, ca.crt) the webhook serves with
MEMORY_WEBHOOK_CA = "gpuslice-webhook-ca"  # Secret with the CA's key, read by the controller only
# The controller's dry-run probe: a claim of this generateName in its own namespace reaches the
# webhook (and nothing else of gpuslice's), which refuses it saying MEMORY_PROBE_ANSWER.
MEMORY_PROBE = "gpuslice-memory-probe-"
MEMORY_PROBE_ANSWER = "gpuslice maxMemory webhook: probe judged"


def class_policy(device_class: str) -> str | None:
    """The policy a gpuslice DeviceClass belongs to: ``[<kind>.]<policy>.gpuslice.dev`` (policy
    names hold no dots); None for any other class."""
    suffix = f".{ATTRIBUTE_DOMAIN}"
    if not device_class.endswith(suffix):
        return None
    parts = device_class.removesuffix(suffix).split(".")
    return parts[-1] or None

# Each node agent's drain object: ConfigMap gpuslice-draining-<node> in gpuslice's namespace, labelled so
# (the gpuslice-drain binding selects its parameters by the label), data {node: device names}.
DRAIN_OBJECT_PREFIX = "gpuslice-draining-"
DRAIN_LIST_LABEL = "gpuslice.dev/drain-list"
