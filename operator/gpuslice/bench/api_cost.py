"""What gpuslice costs the API server, as the API server counts it: the scale figure's windows.

Requests come from the API server's audit log (devcluster.audit: gpuslice's own identities only,
each request once, reads included, by who asked); watch traffic from its metrics
``apiserver_watch_events_total`` and ``apiserver_watch_events_sizes`` (events and bytes it sent to
watchers, by resource, every watcher together). A :class:`Window` is opened before and closed after
what is measured.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuslice.bench.harness import BenchCluster, retry
from gpuslice.devcluster.audit import Request

_WATCH = re.compile(r'^apiserver_watch_events_(total|sizes_sum)\{([^}]*)\} ([0-9.e+]+)$')
_LABEL = re.compile(r'(\w+)="([^"]*)"')
AGENT, CONTROLLER = "gpuslice-agent", "gpuslice-controller"


def parse_watch_totals(text: str) -> tuple[Counter[str], Counter[str]]:
    """(events, bytes) the API server sent to watchers, by resource (``gpuslicepolicies``)."""
    events: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    for line in text.splitlines():
        found = _WATCH.match(line)
        if not found:
            continue
        resource = dict(_LABEL.findall(found.group(2))).get("resource", "")
        (events if found.group(1) == "total" else sizes)[resource] += int(float(found.group(3)))
    return events, sizes


@dataclass(frozen=True)
class Cost:
    """What one window cost: gpuslice's requests, and the watch traffic to every watcher."""

    seconds: float
    requests: tuple[Request, ...]
    watch_events: Counter[str] = field(default_factory=Counter)
    watch_bytes: Counter[str] = field(default_factory=Counter)

    def of(self, who: str | None = None) -> list[Request]:
        return [r for r in self.requests if who is None or r.who == who]

    def by_key(self, who: str | None = None) -> dict[str, int]:
        """``verb resource`` -> count, most first."""
        return dict(Counter(r.key for r in self.of(who)).most_common())

    def per_minute(self, who: str | None = None) -> dict[str, float]:
        """``verb resource`` -> requests a minute, most first."""
        scale = 60.0 / self.seconds if self.seconds else 0.0
        return {key: round(n * scale, 2) for key, n in self.by_key(who).items()}

    def total_per_minute(self, who: str | None = None) -> float:
        return round(len(self.of(who)) * 60.0 / self.seconds, 2) if self.seconds else 0.0

    def writes(self) -> int:
        return sum(1 for r in self.requests if r.verb not in ("get", "list", "watch") and not r.dry_run)

    def namespaces(self, who: str | None = None) -> Counter[str]:
        """Requests that named a namespace, by namespace."""
        return Counter(r.namespace for r in self.of(who) if r.namespace)


def watched_by(requests: Iterable[Request], who: str) -> set[str]:
    """The resources ``who`` opened a watch of."""
    return {r.resource for r in requests if r.who == who and r.verb == "watch"}


class Window:
    """Open at a moment, closed later: what gpuslice asked meanwhile and what watchers were sent."""

    def __init__(self, cluster: BenchCluster) -> None:
        self.cluster = cluster
        self.mark = 0
        self.started = 0.0
        self.events: Counter[str] = Counter()
        self.bytes: Counter[str] = Counter()

    async def _watch(self) -> tuple[Counter[str], Counter[str]]:
        text = await retry(lambda: self.cluster.api.request("GET", "/metrics", accept="text/plain"))
        return parse_watch_totals(text if isinstance(text, str) else str(text))

    async def open(self) -> Window:
        self.events, self.bytes = await self._watch()
        self.mark, self.started = self.cluster.dev.audit.mark(), time.monotonic()
        return self

    async def close(self) -> Cost:
        seconds = time.monotonic() - self.started
        requests = tuple(self.cluster.dev.audit.since(self.mark))
        events, sizes = await self._watch()
        return Cost(seconds, requests, _minus(events, self.events), _minus(sizes, self.bytes))


def _minus(after: Counter[str], before: Mapping[str, int]) -> Counter[str]:
    return Counter({k: after[k] - before.get(k, 0) for k in after if after[k] - before.get(k, 0) > 0})


def summary(cost: Cost) -> dict[str, Any]:
    """A window's figures for results.json: gpuslice's requests a minute, by who and by verb and resource."""
    return {
        "seconds": round(cost.seconds, 1),
        "requests_per_minute": cost.total_per_minute(),
        "controller_per_minute": cost.total_per_minute(CONTROLLER),
        "agents_per_minute": cost.total_per_minute(AGENT),
        "writes": cost.writes(),
        "by_verb_and_resource_per_minute": cost.per_minute(),
        "controller_by_verb_and_resource_per_minute": cost.per_minute(CONTROLLER),
    }
