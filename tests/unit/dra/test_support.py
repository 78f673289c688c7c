"""What a cluster must serve, judged from /version, discovery and a dry-run slice."""

from __future__ import annotations

from typing import Any

from gpuslice.dra.support import NEEDED_RESOURCES, dropped, judge_features, judge_server, probe_devices

V1 = {"v1": [*list(NEEDED_RESOURCES), "devicetaintrules"]}


def version(minor: str, git: str | None = None) -> dict[str, str]:
    return {"major": "1", "minor": minor, "gitVersion": git or f"v1.{minor.rstrip('+')}.2"}


def test_the_tested_minors_pass() -> None:
    for minor in ("36", "37"):
        verdict = judge_server(version(minor), V1)
        assert verdict.ok, verdict.problems
        assert verdict.warnings == ()


def test_an_old_minor_is_refused_with_what_it_lacks() -> None:
    verdict = judge_server(version("35"), V1)
    assert not verdict.ok
    assert "Kubernetes v1.35.2 is too old for gpuslice: it needs 1.36 or newer" in verdict.problems[0]


def test_a_newer_minor_is_a_warning_and_managed_clusters_plus_sign_is_read() -> None:
    verdict = judge_server(version("39+", "v1.39.0-gke.1"), V1)
    assert verdict.ok
    assert "newer than gpuslice has been tested on" in verdict.warnings[0]


def test_without_the_v1_api_nothing_works() -> None:
    verdict = judge_server(version("37"), {"v1beta1": ["resourceclaims"]})
    assert "does not serve deviceclasses, resourceclaims, resourceclaimtemplates, resourceslices in" \
           " resource.k8s.io/v1" in verdict.problems[0]


def _returned(counters: list[dict[str, Any]] | None, devices: list[dict[str, Any]]) -> tuple[Any, Any]:
    return ({"spec": {"sharedCounters": counters}} if counters is not None else {"spec": {}},
            {"spec": {"devices": devices}})


def test_a_server_that_keeps_every_field_drops_nothing() -> None:
    counters, devices = probe_devices()
    assert dropped(*_returned(counters, devices)) == []


def test_dropped_fields_name_their_feature_and_gate() -> None:
    _counters, devices = probe_devices()
    stripped = [{k: v for k, v in d.items() if k not in ("consumesCounters", "taints", "allowMultipleAllocations")}
                for d in devices]
    gone = dropped(*_returned(None, stripped))
    assert gone == ["partitionable", "consumable", "taints"]
    verdict = judge_features(judge_server(version("37"), V1), gone)
    assert not verdict.ok, "without device taints nothing can be drained or held"
    assert "DRADeviceTaints" in verdict.problems[0]
    assert any("DRAPartitionableDevices" in w and "memory and mig mode" in w for w in verdict.warnings)
    assert set(verdict.unsupported_modes()) == {"memory", "mig", "shared"}
    assert "DRAPartitionableDevices" in verdict.unsupported_modes()["memory"]


def test_consumable_capacity_alone_costs_shared_mode_only() -> None:
    counters, devices = probe_devices()
    stripped = [{k: v for k, v in d.items() if k != "allowMultipleAllocations"} for d in devices]
    verdict = judge_features(judge_server(version("37"), V1), dropped(*_returned(counters, stripped)))
    assert verdict.ok
    assert set(verdict.unsupported_modes()) == {"shared"}
