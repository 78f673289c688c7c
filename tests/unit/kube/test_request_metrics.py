"""Each API request is counted once per attempt, by Kubernetes verb and an outcome a person acts on."""

from __future__ import annotations

import pytest

from gpuslice.kube.metrics import outcome, verb


@pytest.mark.parametrize(("method", "path", "content_type", "query", "expected"), [
    ("GET", "/api/v1/nodes", "application/json", {}, "list"),
    ("GET", "/api/v1/nodes/n1", "application/json", {}, "get"),
    ("GET", "/api/v1/namespaces/a/pods", "application/json", {}, "list"),
    ("GET", "/api/v1/namespaces/a/pods/p", "application/json", {}, "get"),
    ("GET", "/api/v1/namespaces/a", "application/json", {}, "get"),
    ("GET", "/apis/resource.k8s.io/v1/resourceslices", "application/json", {"watch": "true"}, "watch"),
    ("GET", "/apis/gpuslice.dev/v1alpha1/gpuslicepolicies/p/status", "application/json", {}, "get"),
    ("POST", "/api/v1/namespaces/a/events", "application/json", {}, "create"),
    ("PUT", "/apis/coordination.k8s.io/v1/namespaces/x/leases/l", "application/json", {}, "update"),
    ("PATCH", "/apis/resource.k8s.io/v1/resourceslices/s", "application/apply-patch+yaml", {}, "apply"),
    ("PATCH", "/apis/gpuslice.dev/v1alpha1/gpuslicepolicies/p/status", "application/merge-patch+json", {}, "patch"),
    ("DELETE", "/apis/resource.k8s.io/v1/resourceslices/s", "application/json", {}, "delete"),
])
def test_verbs(method: str, path: str, content_type: str, query: dict[str, object], expected: str) -> None:
    assert verb(method, path, content_type, query) == expected


def test_outcomes_are_few() -> None:
    assert [outcome(s) for s in (200, 201, 404, 409, 422, 429, 403, 500, 503, None, 418)] == [
        "ok", "ok", "not_found", "conflict", "invalid", "throttled", "forbidden", "server_error", "server_error",
        "unreachable", "client_error"]
