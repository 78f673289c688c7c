"""The maxMemory webhook's metrics: what it decided and how fast, and each ledger's charges."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

from gpuslice.api.ledger import GpuSliceLedger

REVIEWS = Counter("gpuslice_webhook_reviews_total", "Admission reviews answered, by what was judged"
                  " (operation: create, a claim made; allocate, an allocation written) and the answer (verdict:"
                  " allowed, refused).",
                  ["operation", "verdict"])
REVIEW_SECONDS = Histogram(
    "gpuslice_webhook_review_seconds", "Seconds from an admission review's arrival to its answer (its ledger write"
    " included), by what was judged and the answer (an allocation admitted wrote its charge; one refused did not).",
    ["operation", "verdict"],
    buckets=(0.001, 0.002, 0.004, 0.006, 0.008, 0.01, 0.0125, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.065, 0.08, 0.1,
             0.125, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5, 5.0))
CONFLICTS = Counter("gpuslice_webhook_ledger_conflicts_total",
                    "Ledger writes refused because another write came first (then read again and judged again).")
RELEASED = Counter("gpuslice_webhook_charges_released_total",
                   "Charges released by the recalculation: claims deleted or deallocated, and writes that never"
                   " happened.")

RECKON_FAILURES = Counter("gpuslice_webhook_recount_failures_total",
                          "Ledger recounts that failed unexpectedly (a bug: the log has the traceback); each is"
                          " tried again.")

CALLERS_REFUSED = Counter("gpuslice_webhook_callers_refused_total",
                          "Requests refused before their review was read: a caller whose client certificate is not"
                          " the API server's (with --client-ca-file; one without any certificate never gets past the"
                          " TLS handshake and is not counted).")


class LedgerMetrics:
    """Each maxMemory ledger as this copy's watch sees it, read at scrape time (every copy serves the
    same figures: take the max across them)."""

    def __init__(self) -> None:
        self.ledgers: Callable[[], Iterable[GpuSliceLedger]] = list

    def collect(self) -> Iterator[GaugeMetricFamily]:
        charged = GaugeMetricFamily("gpuslice_webhook_ledger_charged_bytes", "GPU memory a maxMemory tenant's ledger"
                                    " charges: what its allocations hold, and any just admitted.",
                                    labels=["policy", "namespace"])
        limit = GaugeMetricFamily("gpuslice_webhook_ledger_limit_bytes", "A maxMemory tenant's limit in force (its"
                                  " ledger's spec.limitBytes).", labels=["policy", "namespace"])
        for ledger in self.ledgers():
            labels = [ledger.spec.policy, ledger.spec.namespace]
            charged.add_metric(labels, ledger.status.held)
            limit.add_metric(labels, ledger.spec.limit_bytes)
        yield charged
        yield limit


LEDGER_METRICS = LedgerMetrics()
REGISTRY.register(LEDGER_METRICS)
