"""The maxMemory webhook's metrics: what it decided and how fast, and each ledger's charges."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

REVIEWS = Counter("gpuslice_webhook_reviews_total", "Admission reviews answered, by what was judged and the answer.",
                  ["operation", "verdict"])
REVIEW_SECONDS = Histogram(
    "gpuslice_webhook_review_seconds", "Seconds from an admission review's arrival to its answer (its ledger write"
    " included), by what was judged.", ["operation"],
    buckets=(0.001, 0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5,
             5.0))
CONFLICTS = Counter("gpuslice_webhook_ledger_conflicts_total",
                    "Ledger writes refused because another write came first (then read again and judged again).")
RELEASED = Counter("gpuslice_webhook_charges_released_total",
                   "Charges released by the recalculation: claims deleted or deallocated, and writes that never"
                   " happened.")
LEDGER_HELD = Gauge("gpuslice_tenant_memory_charged_bytes",
                    "GPU memory a maxMemory tenant's ledger holds charged (its allocations, and any just admitted).",
                    ["policy", "namespace"])
LEDGER_LIMIT = Gauge("gpuslice_tenant_memory_limit_bytes", "A maxMemory tenant's limit in force (its ledger's).",
                     ["policy", "namespace"])
