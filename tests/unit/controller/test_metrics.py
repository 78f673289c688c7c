"""The controller's per-policy gauges: every device state it counts, from the figures of its last reconcile."""

from __future__ import annotations

from gpuslice.api.status import GpuSlicePolicyStatus, SliceCounts
from gpuslice.controller.metrics import PolicyFigures, PolicyMetrics


def test_devices_by_state_include_those_on_failed_and_unhealthy_gpus() -> None:
    metrics = PolicyMetrics()
    status = GpuSlicePolicyStatus(slices=SliceCounts(published=16, allocated=3))
    metrics.record("training", PolicyFigures(status, held=1, draining=2, mig_failed=7, unhealthy=8))
    [devices] = [f for f in metrics.collect() if f.name == "gpuslice_policy_devices"]
    assert {s.labels["state"]: s.value for s in devices.samples} == {
        "published": 16, "allocated": 3, "held": 1, "draining": 2, "mig_failed": 7, "unhealthy": 8}
    metrics.forget("training")
    assert all(not f.samples for f in metrics.collect())


def test_reconciles_are_counted_per_policy_and_kind_and_go_with_the_policy() -> None:
    metrics = PolicyMetrics()
    for kind in ("converge", "status", "status"):
        metrics.reconciled("training", kind)
    [reconciles] = [f for f in metrics.collect() if f.name == "gpuslice_policy_reconciles"]
    assert {(s.name, s.labels["kind"]): s.value for s in reconciles.samples} == {
        ("gpuslice_policy_reconciles_total", "converge"): 1, ("gpuslice_policy_reconciles_total", "status"): 2}
    metrics.forget("training")
    assert all(not f.samples for f in metrics.collect())
