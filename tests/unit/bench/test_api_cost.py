"""The scale figure's counts: watch traffic by resource from the API server's metrics, and
gpuslice's requests a minute by who asked, from its audit log."""

from __future__ import annotations

from collections import Counter

from gpuslice.bench.api_cost import AGENT, CONTROLLER, Cost, parse_watch_totals, summary, watched_by
from gpuslice.devcluster.audit import Request

METRICS = """# HELP apiserver_watch_events_total [BETA] Number of events sent in watch clients
apiserver_watch_events_total{group="gpuslice.dev",resource="gpuslicepolicies",version="v1alpha1"} 12
apiserver_watch_events_total{group="",resource="nodes",version="v1"} 3
apiserver_watch_events_sizes_sum{group="gpuslice.dev",resource="gpuslicepolicies",version="v1alpha1"} 4096
apiserver_watch_events_sizes_count{group="gpuslice.dev",resource="gpuslicepolicies",version="v1alpha1"} 12
apiserver_watch_events_sizes_bucket{group="gpuslice.dev",resource="gpuslicepolicies",version="v1alpha1",le="1024"} 2
"""


def request(who: str, verb: str, resource: str, namespace: str = "", dry_run: bool = False) -> Request:
    return Request(f"system:serviceaccount:gpuslice-system:{who}", "", verb, resource, namespace, "", 200, "", dry_run)


def test_watch_traffic_by_resource() -> None:
    events, sizes = parse_watch_totals(METRICS)
    assert events == {"gpuslicepolicies": 12, "nodes": 3}
    assert sizes == {"gpuslicepolicies": 4096}


def test_a_windows_requests_a_minute_by_who_and_what() -> None:
    requests = (request(CONTROLLER, "get", "leases", "gpuslice-system"), request(CONTROLLER, "update", "leases"),
                request(AGENT, "watch", "gpusliceagentviews"), request(AGENT, "patch", "resourceslices", dry_run=True),
                request(CONTROLLER, "list", "pods", "t-1"))
    cost = Cost(30.0, requests, Counter(), Counter())
    assert cost.total_per_minute() == 10.0
    assert cost.per_minute(CONTROLLER) == {"get leases": 2.0, "update leases": 2.0, "list pods": 2.0}
    assert cost.writes() == 1  # a dry run writes nothing
    assert cost.namespaces(CONTROLLER) == {"gpuslice-system": 1, "t-1": 1}
    assert watched_by(requests, AGENT) == {"gpusliceagentviews"}
    assert summary(cost)["agents_per_minute"] == 4.0
