"""What a cluster must serve, judged from /version, discovery and a dry-run slice."""

from __future__ import annotations

from typing import Any

import pytest

from gpuslice.dra.support import (
    NEEDED_RESOURCES,
    chart_kube_version,
    dropped,
    dropped_message,
    dropped_paths,
    judge_features,
    judge_server,
    probe_devices,
    supported_range,
    taint_rule_api,
)

V1 = {"v1": [*list(NEEDED_RESOURCES), "devicetaintrules"]}


def version(minor: str, git: str | None = None) -> dict[str, str]:
    return {"major": "1", "minor": minor, "gitVersion": git or f"v1.{minor.rstrip('+')}.2"}


def test_the_tested_minors_pass() -> None:
    for minor in ("36", "37"):
        verdict = judge_server(version(minor), V1)
        assert verdict.ok, verdict.problems
        assert verdict.warnings == ()


@pytest.mark.parametrize("git", ["v1.36.2", "v1.36.3-eks-1a2b3c", "v1.37.0", "v1.37.2-gke.1100"])
def test_every_supported_patch_passes(git: str) -> None:
    verdict = judge_server(version(git.split(".")[1], git), V1)
    assert verdict.ok, verdict.problems
    assert verdict.warnings == ()


def test_an_old_minor_is_refused_with_what_it_lacks_and_what_to_do() -> None:
    verdict = judge_server(version("35"), V1)
    assert not verdict.ok
    problem = verdict.problems[0]
    assert problem.startswith("Kubernetes v1.35.2 is too old for gpuslice: partitionable devices, consumable"
                              " capacity and device taints are alpha there and off unless the gates")
    for gate in ("DRAPartitionableDevices", "DRAConsumableCapacity", "DRADeviceTaints"):
        assert gate in problem
    assert "gpuslice needs 1.36.2 or newer" in problem
    assert "upgrade the cluster" in problem
    assert "too old for gpuslice. gpuslice needs 1.36.2 or newer" in judge_server(version("34"), V1).problems[0]


@pytest.mark.parametrize("git", ["v1.36.0", "v1.36.1", "v1.36.1-eks-1a2b3c", "v1.36.1-gke.300"])
def test_136_before_its_second_patch_is_refused_naming_the_scheduler_bugs(git: str) -> None:
    verdict = judge_server(version("36", git), V1)
    assert not verdict.ok
    problem = verdict.problems[0]
    assert problem.startswith(f"Kubernetes {git} is refused: its kube-scheduler panics on a claim with"
                              " allocationMode: All")
    assert "kubernetes/kubernetes#138885" in problem
    assert "kubernetes/kubernetes#139034" in problem
    assert "Upgrade to 1.36.2 or newer" in problem


def test_a_version_without_a_patch_is_a_warning_naming_the_oldest_patch() -> None:
    verdict = judge_server({"major": "1", "minor": "36+"}, V1)
    assert verdict.ok
    assert "needs 1.36.2 or newer" in verdict.warnings[0]


def test_the_range_docs_name_and_the_charts_floor_come_from_the_matrix() -> None:
    assert supported_range() == "Kubernetes 1.36.2 or newer (tested: 1.36 and 1.37)"
    assert chart_kube_version() == ">=1.36.2-0"


def test_devicetaintrules_are_asked_for_only_where_served() -> None:
    assert taint_rule_api(V1) == "resource.k8s.io/v1"
    assert taint_rule_api({"v1": list(NEEDED_RESOURCES), "v1beta2": ["devicetaintrules"]}) == "resource.k8s.io/v1beta2"
    assert taint_rule_api({"v1": list(NEEDED_RESOURCES)}) is None, "a stock 1.36 serves none: not asked for"


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


def test_a_field_the_server_dropped_is_found_and_named_with_its_gate() -> None:
    sent = {"selectors": [{"cel": {"expression": "true"}}], "extendedResourceName": "example.com/gpu"}
    kept = {"selectors": [{"cel": {"expression": "true"}}], "config": None}
    assert dropped_paths(sent, {**kept, "extendedResourceName": "example.com/gpu"}, "spec") == []
    assert dropped_paths(sent, kept, "spec") == ["spec.extendedResourceName"]
    message = dropped_message("DeviceClass", "team-a", ["spec.extendedResourceName"])
    assert "DeviceClass team-a without spec.extendedResourceName" in message
    assert "DRAExtendedResource is off" in message


def test_a_claim_template_without_its_capacity_request_names_consumable_capacity() -> None:
    request = {"name": "gpu", "exactly": {"deviceClassName": "c", "capacity": {"requests": {"memory": "10Gi"}}}}
    sent = {"spec": {"devices": {"requests": [request]}}}
    back = {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "c", "count": 1}}]}}}
    lost = dropped_paths(sent, back, "spec")
    assert lost == ["spec.spec.devices.requests[0].exactly.capacity"]
    assert "DRAConsumableCapacity" in dropped_message("ResourceClaimTemplate", "ns/t", lost)
    assert "mutating admission webhook" in dropped_message("DeviceClass", "c", ["spec.selectors"])
