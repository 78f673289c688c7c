"""Tenancy as the controller sees to it: which tenants are admitted, and proof that the
apiserver enforces the rule before a policy is called Valid.

The rule itself is the static admission policy ``gpuslice-tenancy`` (manifests/admission.yaml,
built in planning.cluster.tenancy_rule). Two things here feed and check it:

- ``status.admittedTenants``: a tenant namespace is admitted (by UID) only once the policy has
  been converged for it; a limited tenant only for the kinds of device its quota has *in force*
  at the limits its spec says. In force means the quota's ``status.hard``, which is what
  the apiserver's quota admission reads: a quota kube-controller-manager has not synced yet (just
  made, just changed, or KCM stalled) counts nothing, and claims made meanwhile would never be
  counted. The record also keeps those limits, the classes and when the quota was made, so the
  admission policy refuses claims under limits the spec no longer says, of a kind the quota does
  not count yet, and allocations of claims made before the quota existed;
- the probe: a dry-run claim for the policy's class from the controller's own namespace, which
  can never be a tenant, and which the controller labels so that ``gpuslice-tenancy`` judges it.
  Only that rule's refusal proves the apiserver enforces tenancy for this policy now; a timer
  would only guess. The rule for every namespace no policy names, ``gpuslice-non-tenants``, has
  no parameter and is the same for every policy: the probe checks that it and its binding are
  in place (a dry run there would need a namespace the controller may not write in).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuslice.api.ledger import ledger_name
from gpuslice.api.policy import Tenant
from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.api.status import AdmittedTenant, LimitsInForce
from gpuslice.controller.admin_access import NamespaceView
from gpuslice.controller.tenancy_labels import MEMORY_ROUTE, judged
from gpuslice.coordinates import admission_binding_path, admission_policy_path, claims_in, webhook_configuration_path
from gpuslice.dra.names import (
    MEMORY_PROBE,
    MEMORY_PROBE_ANSWER,
    MEMORY_WEBHOOK,
    MEMORY_WEBHOOK_CONFIG,
    quota_resource,
)
from gpuslice.dra.quantity import parse_quantity
from gpuslice.kube.client import KubeClient, KubeError, NotFound, NotReady
from gpuslice.planning.cluster.cluster_objects import quota_name
from gpuslice.planning.cluster.memory_rule import memory_webhook_drift
from gpuslice.planning.cluster.tenancy_rule import NON_TENANTS, TENANCY, TENANCY_DENIAL
from gpuslice.planning.kinds import DeviceKind, quota

# A claim's creationTimestamp has whole seconds: one made in the second its tenant's quota was made
# cannot be told from one made just before, so a tenant is admitted only once that second is over.
SECOND = datetime.timedelta(seconds=1)


@dataclass(frozen=True)
class QuotaView:
    """A gpuslice quota as the controller's watch saw it: what the apiserver enforces is status.hard."""

    policy: str
    created: str  # metadata.creationTimestamp
    hard: Mapping[str, str] = field(default_factory=dict)  # status.hard

    @classmethod
    def from_quota(cls, policy: str, meta: Mapping[str, Any], status: Mapping[str, Any]) -> QuotaView:
        return cls(policy, str(meta.get("creationTimestamp") or ""), dict(status.get("hard") or {}))


@dataclass(frozen=True)
class Admission:
    """Who is admitted, and in how many seconds to look again for those that wait only on the clock."""

    tenants: list[AdmittedTenant]
    again_in: float | None = None


@dataclass(frozen=True)
class LedgerView:
    """A maxMemory ledger as the controller's watch saw it: in force once the webhook has counted
    the namespace it names (status.since, for spec.namespaceUid)."""

    policy: str
    namespace: str
    namespace_uid: str
    max_memory: str
    limit_bytes: int
    in_force: bool = False
    held: int = 0

    def model_key(self) -> tuple[str, str, str, int, bool]:
        """What admission depends on (not what it holds)."""
        return self.namespace_uid, self.namespace, self.max_memory, self.limit_bytes, self.in_force

    @classmethod
    def from_ledger(cls, spec: Mapping[str, Any], status: Mapping[str, Any]) -> LedgerView:
        uid = str(spec.get("namespaceUid") or "")
        return cls(str(spec.get("policy") or ""), str(spec.get("namespace") or ""), uid,
                   str(spec.get("maxMemory") or ""), int(spec.get("limitBytes") or 0),
                   bool(status.get("since")) and status.get("namespaceUid") == uid, int(status.get("heldBytes") or 0))


def _limits(tenant: Tenant) -> LimitsInForce:
    return LimitsInForce.of(tenant)


def memory_in_force(policy: GpuSlicePolicy, tenant: Tenant, view: NamespaceView,
                    ledgers: Mapping[str, LedgerView]) -> bool:
    """Whether the webhook charges the tenant's allocations at the maxMemory its spec says: its
    ledger counted this incarnation of the namespace at that limit, and the namespace's label routes
    its claims to the webhook."""
    found = ledgers.get(ledger_name(policy.name, tenant.namespace))
    return (found is not None and found.in_force and found.namespace_uid == view.uid
            and found.max_memory == tenant.max_memory and found.limit_bytes == tenant.max_memory_bytes
            and judged(view, MEMORY_ROUTE))


def _parse(stamp: str) -> datetime.datetime | None:
    try:
        return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None


def classes_in_force(policy: GpuSlicePolicy, tenant: Tenant, kinds: Sequence[DeviceKind],
                     found: QuotaView | None) -> list[str]:
    """The classes whose devices the tenant's quota counts now at the limit its spec says."""
    if found is None or found.policy != policy.name:
        return []
    counted = []
    for kind in kinds:
        hard = found.hard.get(quota_resource(kind.class_name))
        try:
            if hard is not None and parse_quantity(hard) == quota(tenant, kind):
                counted.append(kind.class_name)
        except ValueError:
            continue
    return sorted(counted)


def admitted_tenants(
    policy: GpuSlicePolicy, namespaces: Mapping[str, NamespaceView], previously: Sequence[AdmittedTenant], *,
    kinds: Sequence[DeviceKind] = (), quotas: Mapping[tuple[str, str], QuotaView] | None = None,
    ledgers: Mapping[str, LedgerView] | None = None, webhook_proven: bool = False,
    converged: bool = False, now: datetime.datetime | None = None,
) -> Admission:
    """The tenants the admission policy may admit. A tenant without limits: once a converge made its
    objects, and from then on while the namespace is the same. A tenant limited by counts: while its
    quota (``quotas``, by namespace and name) counts some kind at the limit its spec says (only those
    kinds are recorded), and from a second after the quota was made (``now``: the controller's
    clock). A tenant with maxMemory: while its ledger is in force at that limit
    (``memory_in_force``), and only once the controller's probe proved the API server calls the
    webhook (``webhook_proven``), unless it was admitted at that very limit before: a webhook down
    later keeps its allocations waiting (it fails closed), it does not take the record away."""
    now = now or datetime.datetime.now(datetime.UTC)
    quotas = quotas or {}
    ledgers = ledgers or {}
    previous = {a.namespace: a.uid for a in previously}
    before = {(a.namespace, a.uid): a.limits.max_memory if a.limits else None for a in previously}
    found: list[AdmittedTenant] = []
    again_in: float | None = None
    for tenant in policy.spec.tenants:
        view = namespaces.get(tenant.namespace)
        if view is None or not view.active or not view.uid:
            continue
        if not tenant.limited:
            if previous.get(tenant.namespace) == view.uid or converged:
                found.append(AdmittedTenant(namespace=tenant.namespace, uid=view.uid))
            continue
        if tenant.memory_limited and not (
                memory_in_force(policy, tenant, view, ledgers)
                and (webhook_proven or before.get((tenant.namespace, view.uid)) == tenant.max_memory)):
            continue
        if not tenant.count_limited:
            found.append(AdmittedTenant(namespace=tenant.namespace, uid=view.uid, limits=_limits(tenant)))
            continue
        live = quotas.get((tenant.namespace, quota_name(policy.name)))
        made = _parse(live.created) if live else None
        classes = classes_in_force(policy, tenant, kinds, live)
        if live is None or made is None or not classes:
            continue
        wait = (made + SECOND - now).total_seconds()
        if wait > 0:
            again_in = min(wait, again_in) if again_in is not None else wait
            continue
        found.append(AdmittedTenant(namespace=tenant.namespace, uid=view.uid, limits=_limits(tenant),
                                    classes=classes, since=live.created))
    return Admission(sorted(found, key=lambda a: a.namespace), again_in)


def probe_claim(class_name: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"generateName": "gpuslice-tenancy-probe-"},
        "spec": {"devices": {"requests": [{"name": "probe", "exactly": {"deviceClassName": class_name}}]}},
    }


async def tenancy_unenforced(kube: KubeClient, namespace: str, policy: str, class_name: str) -> str | None:
    """None when the apiserver's tenancy rule refuses a non-tenant a claim of ``class_name`` and the
    rule for namespaces no policy names is in place; else what is wrong."""
    fix = (f" Apply manifests/admission.yaml (the ValidatingAdmissionPolicies {TENANCY} and {NON_TENANTS}"
           " and their bindings) after crds/; until tenancy is enforced, no node agent publishes this"
           " policy's devices.")
    rule = f"ValidatingAdmissionPolicy '{TENANCY}'"
    try:
        await kube.request("POST", claims_in(namespace),
                           probe_claim(class_name), query={"dryRun": "All"})
    except KubeError as error:
        if error.transient:
            raise  # e.g. an API server just started, its admission not ready yet: ask again soon
        if not_configured_yet(error, rule):
            raise NotReady(error.status, error.reason, error.message, error.body) from error
        if rule in error.message and TENANCY_DENIAL in error.message and f"GpuSlicePolicy {policy}" in error.message:
            return await _non_tenants_missing(kube, fix)
        return (f"gpuslice could not prove that tenancy is enforced: a dry-run ResourceClaim for DeviceClass"
                f" {class_name} from namespace {namespace} (never a tenant) got {error.status} {error.reason}:"
                f" {error.message}.{fix}")
    return (f"tenancy is not enforced: the apiserver admitted a dry-run ResourceClaim for DeviceClass {class_name}"
            f" from namespace {namespace}, which is not a tenant.{fix}")


NOT_CONFIGURED = "failed to configure"  # the API server's words for a rule it holds but cannot evaluate yet


def not_configured_yet(error: KubeError, rule: str) -> bool:
    """Whether ``rule`` (as the API server quotes it) is there and fails closed, but the API server
    cannot evaluate it yet: after a restart its REST mapper learns the rule's paramKind (the
    GpuSlicePolicy CRD) within 30 s."""
    return rule in error.message and NOT_CONFIGURED in error.message


async def _non_tenants_missing(kube: KubeClient, fix: str) -> str | None:
    """What is wrong with ``gpuslice-non-tenants`` (the rule and its Deny binding), or None."""
    try:
        await kube.get(admission_policy_path(NON_TENANTS))
        binding = await kube.get(admission_binding_path(NON_TENANTS))
    except NotFound as error:
        return (f"tenancy is not enforced in namespaces no policy names: {error.message}, so any of them could"
                f" claim this policy's devices.{fix}")
    spec = binding.get("spec") or {}
    if spec.get("policyName") != NON_TENANTS or "Deny" not in (spec.get("validationActions") or []):
        return (f"tenancy is not enforced in namespaces no policy names: the ValidatingAdmissionPolicyBinding"
                f" {NON_TENANTS} does not bind that policy with validationActions [Deny].{fix}")
    return None


def memory_probe_claim() -> dict[str, Any]:
    """A claim only the maxMemory webhook judges (its match conditions know the name): no gpuslice
    class, so no admission policy of gpuslice's looks at it."""
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"generateName": MEMORY_PROBE},
        "spec": {"devices": {"requests": [{"name": "probe", "exactly": {"deviceClassName": "memory-probe.invalid"}}]}},
    }


async def memory_webhook_unenforced(kube: KubeClient, namespace: str) -> str | None:
    """None when the API server calls the maxMemory webhook for claims in the controller's
    namespace (labelled like a maxMemory tenant's), the webhook answers, and its configuration sends
    it the allocation writes too (``memory_webhook_drift``); else what is wrong."""
    fix = (f" Install the webhook: its ValidatingWebhookConfiguration {MEMORY_WEBHOOK_CONFIG} (manifests/"
           "memory-webhook.yaml), its Deployment and Service (manifests/base/webhook.yaml) and RBAC"
           " (manifests/webhook-rbac.yaml); until it answers, no tenant's maxMemory is put in force and"
           " their claims of this policy wait.")
    try:
        await kube.request("POST", claims_in(namespace),
                           memory_probe_claim(), query={"dryRun": "All"})
    except KubeError as error:
        if not (MEMORY_WEBHOOK in error.message and MEMORY_PROBE_ANSWER in error.message):
            return (f"gpuslice could not prove that the maxMemory webhook judges allocations: a dry-run claim from"
                    f" namespace {namespace} got {error.status} {error.reason}: {error.message}.{fix}")
    else:
        return (f"the maxMemory webhook is not called: the API server admitted a dry-run claim in namespace"
                f" {namespace} without asking it.{fix}")
    # The probe is a claim made; an allocation is a write of resourceclaims/status, which no dry run of
    # the controller's can make: the configuration must say the webhook judges it.
    try:
        config = await kube.get(webhook_configuration_path(MEMORY_WEBHOOK_CONFIG))
    except NotFound:
        return f"the ValidatingWebhookConfiguration {MEMORY_WEBHOOK_CONFIG} is gone.{fix}"
    if (drift := memory_webhook_drift(config, namespace)) is not None:
        return (f"the maxMemory webhook may not judge every allocation: ValidatingWebhookConfiguration"
                f" {MEMORY_WEBHOOK_CONFIG}: {drift}. Apply it again as gpuslice ships it"
                " (manifests/memory-webhook.yaml, or the chart); until then no tenant's maxMemory is put in force"
                " and their claims of this policy wait.")
    return None
