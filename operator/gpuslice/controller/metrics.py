"""Prometheus metrics of the controller.

The per-policy and per-tenant series are the policy's status as the controller last computed it
(devices by state, conditions, use against limit), kept in memory and read at scrape time: a
deleted policy's series go with it, and a scrape costs no API request. Labels are bounded by
what the cluster holds: policy names, their tenant namespaces, condition types and device states.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gpuslice.api.status import GpuSlicePolicyStatus

RECONCILES = Counter("gpuslice_controller_reconciles", "Policy reconciles, by result (ok, error).", ["result"])
RECONCILE_DURATION = Histogram(
    "gpuslice_controller_reconcile_duration_seconds",
    "How long one reconcile of a policy took, by kind (converge: objects applied; status: status only).",
    ["kind"], buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0))
LEADER = Gauge("gpuslice_controller_leader", "1 while this controller holds the leader Lease and acts, else 0.")
CONDITIONS = ("Valid", "Published", "Ready", "Degraded")


@dataclass(frozen=True)
class PolicyFigures:
    status: GpuSlicePolicyStatus
    held: int = 0  # allocated devices kept as they were while a change waits
    draining: int = 0  # free devices about to change or go
    mig_failed: int = 0  # devices on GPUs whose MIG reconfiguration failed (tainted mig-failed)
    unhealthy: int = 0  # devices on GPUs their agent found unhealthy (tainted unhealthy)
    # claims on two or more GPUs, by (GPUs, what the GPUs share: planning.reads.topology)
    alignments: Mapping[tuple[int, str], int] = field(default_factory=dict)


class PolicyMetrics(Collector):
    """The last status the controller computed, per policy, as gauges; and how often it reconciled each
    policy (what tells a person, or a test, that the controller looked at a policy again and changed
    nothing)."""

    def __init__(self) -> None:
        self.policies: dict[str, PolicyFigures] = {}
        self.reconciles: dict[tuple[str, str], int] = {}

    def record(self, policy: str, figures: PolicyFigures) -> None:
        self.policies[policy] = figures

    def reconciled(self, policy: str, kind: str) -> None:
        self.reconciles[(policy, kind)] = self.reconciles.get((policy, kind), 0) + 1

    def forget(self, policy: str) -> None:
        self.policies.pop(policy, None)
        self.reconciles = {k: v for k, v in self.reconciles.items() if k[0] != policy}

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        devices = GaugeMetricFamily("gpuslice_policy_devices", "A policy's devices by state: published, allocated,"
                                    " held (allocated, a change waits), draining, mig_failed (on GPUs whose MIG"
                                    " reconfiguration failed), unhealthy (on unhealthy GPUs).",
                                    labels=["policy", "state"])
        conditions = GaugeMetricFamily("gpuslice_policy_condition", "1 when the policy's condition is True, else 0.",
                                       labels=["policy", "condition"])
        gpus = GaugeMetricFamily("gpuslice_policy_gpus", "GPUs the policy selects.", labels=["policy"])
        names = ("allocated_devices", "allocated_bytes", "limit_devices", "limit_bytes")
        helps = ("Devices of the policy the tenant's claims hold.", "GPU memory the tenant's claims hold, in bytes.",
                 "Most devices the tenant may hold (absent: no limit).",
                 "Most GPU memory the tenant may hold, in bytes (absent: no limit).")
        tenants = {n: GaugeMetricFamily(f"gpuslice_tenant_{n}", h, labels=["policy", "namespace"])
                   for n, h in zip(names, helps, strict=True)}
        for name, figures in sorted(self.policies.items()):
            status = figures.status
            for state, value in (("published", status.slices.published), ("allocated", status.slices.allocated),
                                 ("held", figures.held), ("draining", figures.draining),
                                 ("mig_failed", figures.mig_failed), ("unhealthy", figures.unhealthy)):
                devices.add_metric([name, state], value)
            found = {c.type: c.status == "True" for c in status.conditions}
            for condition in CONDITIONS:
                if condition in found:
                    conditions.add_metric([name, condition], 1.0 if found[condition] else 0.0)
            gpus.add_metric([name], status.gpus)
            for tenant in status.tenants:
                labels = [name, tenant.namespace]
                tenants["allocated_devices"].add_metric(labels, tenant.allocated)
                tenants["allocated_bytes"].add_metric(labels, tenant.allocated_bytes)
                if tenant.limit is not None:
                    tenants["limit_devices"].add_metric(labels, tenant.limit)
                if tenant.limit_bytes is not None:
                    tenants["limit_bytes"].add_metric(labels, tenant.limit_bytes)
        aligned = GaugeMetricFamily(
            "gpuslice_policy_aligned_allocations", "Allocated claims of the policy's devices on two or more GPUs, by"
            " how many GPUs and what every one of them shares: nvlink (one NVLink domain), numa (one NUMA node), pcie"
            " (one PCIe root), joined with '-' (nvlink-numa), or any (nothing). The allocations in place now.",
            labels=["policy", "gpus", "alignment"])
        for name, figures in sorted(self.policies.items()):
            for (count, alignment), claims in sorted(figures.alignments.items()):
                aligned.add_metric([name, str(count), alignment], claims)
        reconciles = CounterMetricFamily("gpuslice_policy_reconciles", "Reconciles of the policy by this copy of the"
                                         " controller, by kind (converge: objects applied; status: status only).",
                                         labels=["policy", "kind"])
        for (name, kind), count in sorted(self.reconciles.items()):
            reconciles.add_metric([name, kind], count)
        yield devices
        yield conditions
        yield gpus
        yield from tenants.values()
        yield aligned
        yield reconciles


POLICY_METRICS = PolicyMetrics()
REGISTRY.register(POLICY_METRICS)
