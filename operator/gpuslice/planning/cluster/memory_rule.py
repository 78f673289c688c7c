"""The maxMemory webhook's configuration: which requests reach it, and how it is reached.

A limit that must read a ledger cannot be CEL, so ``maxmemory.gpuslice.dev`` is a validating
admission webhook (gpuslice.webhook). It must never be in anyone else's way, so it is scoped
three times over: the namespaces labelled ``gpuslice.dev/memory-limit=judged`` (the maxMemory
tenants of some policy, and the controller's own namespace for its probe), the moments it judges
(a claim made, an allocation written: ``resourceclaims/status``), and claims that
name a gpuslice DeviceClass (or the controller's probe). Every other claim in the cluster never
waits on it. For those it judges it fails closed (``failurePolicy: Fail``): while it is down, a
maxMemory tenant's allocations wait and the pod's Events quote the API server's reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from gpuslice.dra.names import (
    CONTROLLER_NAMESPACE,
    MANAGED_BY,
    MEMORY_JUDGED,
    MEMORY_LABEL,
    MEMORY_PROBE,
    MEMORY_WEBHOOK,
    MEMORY_WEBHOOK_CONFIG,
    MEMORY_WEBHOOK_PATH,
    MEMORY_WEBHOOK_SERVICE,
)
from gpuslice.jsontypes import Object
from gpuslice.planning.cluster.tenancy_rule import ADMISSION_V1, ALLOCATING, NAMES_GPUSLICE_CLASS

TIMEOUT_SECONDS = 5  # the API server gives up on the webhook after this long (and refuses)


def _probe(home: str) -> str:
    return (f"request.namespace == '{home}' && has(object.metadata.generateName)"
            f" && object.metadata.generateName == '{MEMORY_PROBE}'")


def memory_namespaces() -> dict[str, Any]:
    return {"matchLabels": {MEMORY_LABEL: MEMORY_JUDGED}}


def memory_webhook(url: str | None = None, ca_bundle: str | None = None,
                   home: str = CONTROLLER_NAMESPACE) -> Object:
    """The ValidatingWebhookConfiguration: by the Service ``gpuslice-webhook`` in ``home``
    (gpuslice's own namespace), or by ``url`` (the dev cluster, whose API server reaches it on loopback).
    The controller writes ``caBundle`` (or cert-manager, in that overlay)."""
    client: dict[str, Any] = ({"url": url} if url else {"service": {
        "namespace": home, "name": MEMORY_WEBHOOK_SERVICE, "path": MEMORY_WEBHOOK_PATH, "port": 443}})
    if ca_bundle:
        client["caBundle"] = ca_bundle
    return {
        "apiVersion": ADMISSION_V1, "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": MEMORY_WEBHOOK_CONFIG, "labels": dict(MANAGED_BY)},
        "webhooks": [{
            "name": MEMORY_WEBHOOK,
            "clientConfig": client,
            "rules": [
                # Claims, not templates: a template's claims are judged when they are made from it (the
                # pod's Events say why), and the controller's own templates never wait on the webhook.
                {"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"], "operations": ["CREATE"],
                 "resources": ["resourceclaims"], "scope": "Namespaced"},
                {"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"], "operations": ["UPDATE"],
                 "resources": ["resourceclaims/status"], "scope": "Namespaced"},
            ],
            "matchPolicy": "Equivalent",
            "namespaceSelector": memory_namespaces(),
            "matchConditions": [
                {"name": "made-or-allocated", "expression": f"request.operation == 'CREATE' || {ALLOCATING}"},
                # In gpuslice's own namespace only its probe: the tenancy and drain probes made there
                # never wait on this webhook.
                {"name": "names-a-gpuslice-class-or-is-the-probe",
                 "expression": f"(request.namespace != '{home}' && ({NAMES_GPUSLICE_CLASS}))"
                               f" || ({_probe(home)})"},
            ],
            "failurePolicy": "Fail",
            # It writes its ledger when it admits an allocation; a dry run is judged, never charged.
            "sideEffects": "NoneOnDryRun",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": TIMEOUT_SECONDS,
        }],
    }


_JUDGED = ("namespaceSelector", "matchConditions", "failurePolicy", "matchPolicy")


def _covers(rule: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Whether ``rule`` matches every request ``wanted`` (a rule of ours) matches."""
    def has(key: str, value: str, wildcard: str = "*") -> bool:
        return any(v in (value, wildcard) for v in rule.get(key) or [])

    return (all(has("apiGroups", g) for g in wanted["apiGroups"]) and all(has("apiVersions", v)
                                                                          for v in wanted["apiVersions"])
            and all(has("operations", o) for o in wanted["operations"])
            and all(has("resources", r) or has("resources", r, "*/*") for r in wanted["resources"])
            and rule.get("scope", "*") in (wanted["scope"], "*"))


def memory_webhook_drift(config: Mapping[str, Any], home: str) -> str | None:
    """What of the ValidatingWebhookConfiguration ``config``, as the API server holds it, would let a
    claim's creation or allocation write past the webhook (a rule dropped, a condition or selector
    changed, failurePolicy Ignore); None when it judges what gpuslice's judges. The controller's probe
    proves only that a claim's creation reaches the webhook; this proves the allocation writes do too.
    Where the webhook is reached (clientConfig) and how long it is waited for are the install's."""
    ours = memory_webhook(home=home)["webhooks"][0]
    hook = next((h for h in config.get("webhooks") or [] if h.get("name") == MEMORY_WEBHOOK), None)
    if hook is None:
        return f"it has no webhook {MEMORY_WEBHOOK}"
    missing = [r for r in ours["rules"] if not any(_covers(have, r) for have in hook.get("rules") or [])]
    if missing:
        return ("its rules do not match " + " and ".join(f"{', '.join(r['operations'])} of {', '.join(r['resources'])}"
                                                         for r in missing))
    changed = [key for key in _JUDGED if hook.get(key) != ours[key]]
    if hook.get("objectSelector"):
        changed.append("objectSelector")
    if changed:
        return f"its {', '.join(changed)} are not gpuslice's (manifests/memory-webhook.yaml)"
    return None


def memory_webhook_yaml() -> str:
    header = (
        "# Generated from operator/gpuslice/planning/cluster/memory_rule.py by `make crds`; do not edit here.\n"
        "# The maxMemory webhook: only claims of gpuslice's DeviceClasses, made or allocated in the\n"
        "# namespaces labelled gpuslice.dev/memory-limit=judged (maxMemory tenants), reach it; it fails\n"
        "# closed for those. The gpuslice controller writes caBundle (or cert-manager: the\n"
        "# cert-manager overlay). Apply after crds/ and manifests/webhook-rbac.yaml.\n"
    )
    return header + yaml.safe_dump(memory_webhook(), sort_keys=False, width=100)


if __name__ == "__main__":
    print(memory_webhook_yaml(), end="")
