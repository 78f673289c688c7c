"""The one reader of a GpuSlicePolicy body that may not parse: what it names, and what a body that
the model refuses (or that is not even the CRD's shape) reads as."""

from __future__ import annotations

from typing import Any

import pytest

from gpuslice.api.resource import valid_policy
from gpuslice.dra.policy_wire import (
    TenantEntry,
    admin_namespaces,
    policy_spec,
    raw_tenants,
    tenant_namespaces,
    tenants,
)
from tests.builders import policy

SLICING = {"mode": "memory", "sliceSize": "10Gi"}


def test_a_valid_policy_reads_as_its_model_does() -> None:
    body = policy("p", SLICING, tenants=[{"namespace": "team-a", "maxMemory": "30Gi"}, {"namespace": "team-b"}],
                  adminAccess={"namespaces": ["ops"]})
    parsed = valid_policy(body)
    assert parsed is not None
    assert tenant_namespaces(body) == [t.namespace for t in parsed.spec.tenants] == ["team-a", "team-b"]
    assert tenants(body) == [TenantEntry("team-a", "30Gi"), TenantEntry("team-b", None)]
    assert admin_namespaces(body) == ["ops"]


def test_a_policy_the_model_refuses_still_names_its_namespaces() -> None:
    body = policy("p", SLICING, tenants=[{"namespace": "team-a", "maxMemory": "lots"}, {"namespace": "team-b", "maxSlices": -1}])
    assert valid_policy(body) is None
    assert tenants(body) == [TenantEntry("team-a", "lots"), TenantEntry("team-b", None)]


def test_a_tenant_without_a_namespace_names_none() -> None:
    body = {"spec": {"tenants": [{"maxMemory": "1Gi"}, {"namespace": None}, {"namespace": ""}, {"namespace": "a"}]}}
    assert tenants(body) == [TenantEntry("a", None)]
    assert len(raw_tenants(body)) == 4


def test_max_memory_is_kept_as_written() -> None:
    body = {"spec": {"tenants": [{"namespace": "a", "maxMemory": 1000}]}}
    assert tenants(body) == [TenantEntry("a", "1000")]


@pytest.mark.parametrize("body", [
    {}, {"spec": None}, {"spec": "tenants"}, {"spec": []}, {"spec": {"tenants": None, "adminAccess": None}},
    {"spec": {"tenants": {"namespace": "a"}, "adminAccess": {"namespaces": "ops"}}},
    {"spec": {"tenants": ["a", 3, None], "adminAccess": ["ops"]}},
    {"spec": {"tenants": [], "adminAccess": {"namespaces": [None, 3, ""]}}},
])
def test_a_body_that_does_not_parse_names_nothing_and_crashes_no_reader(body: dict[str, Any]) -> None:
    assert tenants(body) == []
    assert tenant_namespaces(body) == []
    assert raw_tenants(body) == []
    assert admin_namespaces(body) == []


def test_the_spec_is_the_bodys_own_or_empty() -> None:
    body = {"spec": {"claimTemplateName": "gpu"}}
    assert policy_spec(body) is body["spec"]
    assert policy_spec({"spec": 5}) == {}
