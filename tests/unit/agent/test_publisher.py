"""An agent parses a policy once per resourceVersion: parsing every policy on every cycle was half
the CPU of a thousand agents (bench, scale figure), and a policy changes far less often than cycles run."""

from __future__ import annotations

from typing import Any

import pytest

from gpuslice.agent import publisher
from gpuslice.agent.publisher import sort_policies
from gpuslice.api.resource import GpuSlicePolicy
from tests.builders import policy


def _versioned(name: str, version: str, size: str = "10Gi") -> dict[str, Any]:
    body = policy(name, {"mode": "memory", "sliceSize": "10Gi"}, None, generation=1, tenants=["t"], judged=True)
    body["metadata"]["resourceVersion"] = version
    body["spec"]["slicing"]["sliceSize"] = size
    return body


def test_a_policy_is_parsed_again_only_when_its_version_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    parsed_now: list[str] = []
    real = GpuSlicePolicy.from_body

    def counting(body: dict[str, Any]) -> GpuSlicePolicy:
        parsed_now.append(body["metadata"]["name"])
        return real(body)

    monkeypatch.setattr(publisher.GpuSlicePolicy, "from_body", staticmethod(counting))
    cache: dict[str, tuple[str, Any]] = {}
    first = sort_policies([_versioned("a", "1"), _versioned("b", "2")], None, cache)
    again = sort_policies([_versioned("a", "1"), _versioned("b", "2")], None, cache)
    assert parsed_now == ["a", "b"]
    assert [p.name for p in again.plannable] == [p.name for p in first.plannable] == ["a", "b"]

    edited = sort_policies([_versioned("a", "3", "20Gi"), _versioned("b", "2")], None, cache)
    assert parsed_now == ["a", "b", "a"]
    assert str(edited.plannable[0].spec.slicing.slice_size) != str(first.plannable[0].spec.slicing.slice_size)

    sort_policies([_versioned("b", "2")], None, cache)
    assert set(cache) == {"b"}, "a deleted policy leaves the cache"


def test_a_policy_that_does_not_parse_is_remembered_as_such() -> None:
    bad = _versioned("bad", "7")
    bad["spec"]["slicing"]["sliceSize"] = "a lot"
    cache: dict[str, tuple[str, Any]] = {}
    for _ in range(2):
        policies = sort_policies([bad], None, cache)
        assert policies.frozen["bad"].startswith("it does not parse")
        assert not policies.plannable
