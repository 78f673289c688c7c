"""Everything the controller can be told, in one place (flags and ``GPUSLICE_*`` environment variables)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from gpuslice.settings import ProcessSettings


class ControllerSettings(ProcessSettings):
    liveness_port: int | None = Field(default=None, ge=1, le=65535, description=(
        "Serve Kopf's liveness probe on this port (/healthz); off when unset."))
    status_interval: float = Field(default=10.0, gt=0, description=(
        "Seconds between checks of each policy's status; a check computes from memory and writes only when"
        " something it reads changed, so a short interval costs little."))
    drift_interval: float = Field(default=120.0, gt=0, description=(
        "Seconds between full re-applies of a policy's objects, which repair edits made by others. Each compares"
        " what the policy wants with what the controller's watches hold and writes only what differs; one"
        " policy's tenancy probe each interval stands for all."))
    crd_interval: float = Field(default=10.0, gt=0, description=(
        "A watch of the GpuSlicePolicy CRD says when it goes (no request while it stays served); this is how"
        " often it is asked instead while it is being deleted with policies left, or where the RBAC grants no"
        " watch of it. Once it is gone the controller stops Kopf and waits for it, asking again after 1 s"
        " doubling to 30 s."))
    first_retry: float = Field(default=2.0, gt=0, description=(
        "Seconds before a failed converge is tried again; doubles with each failure of the same generation."))
    last_retry: float = Field(default=300.0, gt=0, description=(
        "Seconds between tries at most: bad input is retried now and then, never in a loop."))
    leader_election: bool = Field(default=True, description=(
        "Act only while holding the Lease gpuslice-controller in gpuslice's namespace (--namespace), so that a"
        " second copy (two replicas, or one on a laptop) waits instead of acting at the same time."))
    lease_duration: float = Field(default=15.0, gt=0, description=(
        "Seconds a Lease not renewed keeps others waiting (as each waiting copy measures on its own clock"
        " from when it last saw the Lease change): how long a crashed leader's successor waits."))
    renew_deadline: float = Field(default=10.0, gt=0, description=(
        "Seconds the leader may go without renewing before it stops acting; below lease_duration, so it"
        " stops before anyone may take over."))
    retry_period: float = Field(default=2.0, gt=0, description="Seconds between tries to take or renew the Lease.")
    webhook_certs: Literal["managed", "external"] = Field(default="managed", description=(
        "managed: the controller makes and rotates the maxMemory webhook's CA and serving certificate (Secrets"
        " gpuslice-webhook-ca and gpuslice-webhook-tls) and writes the CA into its ValidatingWebhookConfiguration;"
        " external: someone else does (cert-manager: manifests/overlays/cert-manager)."))
    webhook_hosts: str = Field(default="", description=(
        "More names for the webhook's serving certificate, comma-separated, besides its Service's"
        " (gpuslice-webhook.<namespace>.svc): e.g. 127.0.0.1 when the API server calls it by URL."))
    webhook_cert_hours: float = Field(default=8760.0, gt=0, description=(
        "Hours the webhook's serving certificate is valid (a year); it is replaced with a third left."))
    webhook_ca_hours: float = Field(default=87600.0, gt=0, description=(
        "Hours the webhook's CA is valid (ten years); a new one is trusted next to it with a third left."))
    webhook_cert_interval: float = Field(default=600.0, gt=0, description=(
        "Seconds between checks of the webhook's certificates (and of the caBundle someone may have removed)."))
    defrag_interval: float = Field(default=30.0, gt=0, description=(
        "Seconds between looks at most, per policy in defragmentation mode Auto, for pods waiting long enough"
        " that moving pods would make room for. A look reads the cluster (the claims, and the pods of the"
        " policy's tenants) only when the controller's watch holds a pod of its tenants waiting that long and"
        " something changed since the last look."))
    scheduler_retry_interval: float = Field(default=30.0, ge=0, description=(
        "Seconds between looks for pods kube-scheduler turned away while allocations it then failed to write"
        " were in flight (a tenant over its maxMemory), whose devices are free: the controller annotates their"
        " DeviceClass, which makes the scheduler try them again instead of after its 5-minute flush. A look reads"
        " the pods from the controller's watch of pods not yet on a node, and lists the slices and claims (once"
        " each, cluster-wide) only when such a pod is due and something changed; 0 turns it off."))
    defrag_timeout: float = Field(default=300.0, gt=0, description=(
        "Seconds a move may take, from its start until the waiting claim is allocated, before it is given up:"
        " its record goes and its GPU's taint lifts. A move requested by hand (gpuslice defrag --timeout) is"
        " taken up until this at most."))
    defrag_taint_wait: float = Field(default=30.0, gt=0, description=(
        "Seconds a move waits for the node agent to taint the GPU being freed before it evicts anything;"
        " past that the move is given up (the agent may be down), having evicted nothing."))

    @model_validator(mode="after")
    def _leases(self) -> ControllerSettings:
        if not self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError("leader election needs retry_period < renew_deadline < lease_duration (seconds):"
                             f" got {self.retry_period}, {self.renew_deadline}, {self.lease_duration}")
        if self.first_retry > self.last_retry:
            raise ValueError(f"first_retry ({self.first_retry} s) is longer than last_retry ({self.last_retry} s)")
        return self
