"""The committed CRD is what the models generate, and the models parse what users write."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pydantic
import pytest

from gpuslice.api.crd import CRDS, crd, crd_yaml
from gpuslice.api.policy import MAX_COUNT, MAX_MEMORY, GpuSlicePolicySpec, Tenant
from gpuslice.planning.kinds import INT64_MAX, DeviceKind, limit_bytes

COMMITTED = Path(__file__).resolve().parents[3] / "crds" / "gpuslicepolicies.gpuslice.dev.yaml"


def test_committed_crd_is_not_stale() -> None:
    assert COMMITTED.read_text() == crd_yaml(), "crds/ is stale: run `make crds` and commit the result"
    for file, make in CRDS.items():
        assert (COMMITTED.parent / file).read_text() == crd_yaml(make), f"crds/{file} is stale: run `make crds`"


@pytest.mark.parametrize(("value", "ok"), [("30Gi", True), ("1Pi", True), ("512Mi", True), ("0", False),
                                           ("-1Gi", False), ("2Pi", False), ("lots", False)])
def test_max_memory_is_a_positive_quantity_with_a_maximum(value: str, ok: bool) -> None:
    """The same rule as the CRD's (tests/cluster/api checks the API server's): every mode, with or
    without the count limits."""
    if ok:
        tenant = Tenant.model_validate({"namespace": "team-a", "maxMemory": value, "maxSlices": 2})
        assert tenant.memory_limited
        assert tenant.count_limited
        assert tenant.max_memory_bytes
    else:
        with pytest.raises(pydantic.ValidationError, match="maxMemory must be a positive quantity of at most 1Pi"):
            Tenant.model_validate({"namespace": "team-a", "maxMemory": value})
    rule = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["tenants"][
        "items"]["properties"]["maxMemory"]["x-kubernetes-validations"][0]
    assert "quantity('1Pi')" in rule["rule"]


def test_every_field_is_documented() -> None:
    def walk(schema: dict[str, object], path: str) -> list[str]:
        missing = []
        for name, sub in schema.get("properties", {}).items():  # type: ignore[attr-defined]
            where = f"{path}.{name}"
            if "description" not in sub:
                missing.append(where)
            missing += walk(sub, where)
            if isinstance(sub.get("items"), dict):
                missing += walk(sub["items"], where + "[]")
        return missing

    spec = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert walk(spec, "spec") == []


def test_example_policy_parses_with_camel_case_and_defaults() -> None:
    spec = GpuSlicePolicySpec.model_validate({
        "nodeSelector": {"matchLabels": {"gpuslice.dev/pool": "inference"}},
        "gpuSelector": {"products": ["NVIDIA H100 80GB HBM3"], "minMemory": "40Gi"},
        "slicing": {"mode": "memory", "sliceSize": "10Gi", "allowFullGpu": True},
        "tenants": [{"namespace": "team-a", "maxSlices": 8}],
        "adminAccess": {"namespaces": ["gpu-monitoring"]},
        "taints": [{"key": "gpuslice.dev/maintenance", "effect": "NoSchedule"}],
    })
    assert spec.claim_template_name == "gpu-slice"
    assert spec.slicing.slice_bytes == 10 * 1024**3
    assert spec.gpu_selector.min_memory_bytes == 40 * 1024**3
    assert spec.node_selector.matches({"gpuslice.dev/pool": "inference"})
    assert not spec.node_selector.matches({"gpuslice.dev/pool": "training"})


def test_label_selector_expressions() -> None:
    spec = GpuSlicePolicySpec.model_validate({
        "slicing": {"mode": "shared", "sliceSize": "5Gi"},
        "nodeSelector": {"matchExpressions": [
            {"key": "zone", "operator": "In", "values": ["a", "b"]},
            {"key": "spot", "operator": "DoesNotExist"},
        ]},
    })
    assert spec.node_selector.matches({"zone": "a"})
    assert not spec.node_selector.matches({"zone": "c"})
    assert not spec.node_selector.matches({"zone": "a", "spot": "true"})


def test_messages_of_several_broken_rules_are_all_reported() -> None:
    with pytest.raises(pydantic.ValidationError) as failed:
        GpuSlicePolicySpec.model_validate({"slicing": {"mode": "mig", "sliceSize": "10Gi", "allowFullGpu": True}})
    text = str(failed.value)
    assert "sliceSize does not apply in mig mode" in text
    assert "slicing.mig is required in mig mode" in text
    assert "allowFullGpu applies to memory mode only" in text


EXAMPLES = sorted((Path(__file__).resolve().parents[3] / "examples" / "policies").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_valid_policies(path: Path) -> None:
    import yaml

    body = yaml.safe_load(path.read_text())
    assert body["kind"] == "GpuSlicePolicy"
    GpuSlicePolicySpec.model_validate(body["spec"])


def test_there_are_examples() -> None:
    assert len(EXAMPLES) >= 3


def test_tenant_names_fit_a_column_and_count_the_rest() -> None:
    from gpuslice.controller.status import tenant_names

    assert tenant_names(["team-a", "team-b"]) == "team-a, team-b"
    many = [f"tenant-{i:02d}" for i in range(20)]
    shown = tenant_names(many)
    assert len(shown) <= 60
    assert shown.endswith(f", +{20 - shown.count(',')}")
    assert shown.startswith("tenant-00, tenant-01")


def _numbers(schema: dict[str, Any], path: str) -> dict[str, dict[str, Any]]:
    """Every integer or number in ``schema``, by path (map values as ``path.*``)."""
    found: dict[str, dict[str, Any]] = {}
    if schema.get("type") in ("integer", "number"):
        found[path] = schema
    for name, sub in (schema.get("properties") or {}).items():
        found |= _numbers(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        found |= _numbers(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        found |= _numbers(schema["additionalProperties"], f"{path}.*")
    return found


def test_every_number_of_the_spec_has_bounds() -> None:
    """H3 of the December review: maxSlices had no maximum, and 10^10 of them overflowed the int64 of
    status.tenants[].limitBytes. Each number now has both bounds in the schema, or a rule that says them."""
    spec = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    numbers = _numbers(spec, "spec")
    own = {"spec.defragmentation.maxEvictionsPerHour": (0, 1000), "spec.defragmentation.minPendingSeconds": (0, 86400),
           "spec.topology.counts[]": (2, 32)}  # a claim is allocated at most 32 devices
    assert set(numbers) == {"spec.tenants[].maxSlices", "spec.tenants[].maxFullGpus", "spec.tenants[].maxMigDevices.*",
                            "spec.slicing.mig.layout.*", *own}, "a new number: give it bounds and a test"
    by_rule = {"spec.slicing.mig.layout.*"}  # "a count from 1 to 7", a rule of MigSlicing
    for path, schema in numbers.items():
        if path not in by_rule:
            assert (schema.get("minimum"), schema.get("maximum")) == own.get(path, (0, MAX_COUNT)), path
    rules = " ".join(r["rule"] for r in spec["properties"]["slicing"]["properties"]["mig"]["x-kubernetes-validations"])
    assert "self.layout[p] >= 1 && self.layout[p] <= 7" in rules
    # The sizes are quantities (strings): bounded by rules, with the same words in Python.
    for where, field, rules_of in (("slicing", "sliceSize", spec["properties"]["slicing"]),
                                   ("gpuSelector", "minMemory", spec["properties"]["gpuSelector"])):
        assert any(f"quantity(self.{field}).isGreaterThan(quantity('{MAX_MEMORY}'))" in r["rule"]
                   for r in rules_of["x-kubernetes-validations"]), where


@pytest.mark.parametrize(("spec", "message"), [
    ({"slicing": {"mode": "memory", "sliceSize": "10Gi"}, "tenants": [{"namespace": "a", "maxSlices": MAX_COUNT + 1}]},
     "less than or equal to 1000000"),
    ({"slicing": {"mode": "memory", "sliceSize": "10Gi"}, "tenants": [{"namespace": "a", "maxSlices": -1}]},
     "greater than or equal to 0"),
    ({"slicing": {"mode": "memory", "sliceSize": "10Gi", "allowFullGpu": True},
      "tenants": [{"namespace": "a", "maxFullGpus": MAX_COUNT + 1}]}, "less than or equal to 1000000"),
    ({"slicing": {"mode": "mig", "mig": {"profiles": ["1g.10gb"]}},
      "tenants": [{"namespace": "a", "maxMigDevices": {"1g.10gb": MAX_COUNT + 1}}]}, "less than or equal to 1000000"),
    ({"slicing": {"mode": "mig", "mig": {"layout": {"1g.10gb": 0}}}}, "a count from 1 to 7"),
    ({"slicing": {"mode": "memory", "sliceSize": "10Gi", "allowFullGpu": True}, "topology": {"counts": [33]}},
     "less than or equal to 32"),
    ({"slicing": {"mode": "memory", "sliceSize": "10Gi", "allowFullGpu": True}, "topology": {"counts": [1]}},
     "greater than or equal to 2"),
    ({"slicing": {"mode": "memory", "sliceSize": "16385Gi"}}, "slicing.sliceSize must be at most 16Ti"),
    ({"slicing": {"mode": "memory", "sliceSize": "10Gi"}, "gpuSelector": {"minMemory": "1E"}},
     "gpuSelector.minMemory must be at most 16Ti"),
])
def test_numbers_past_their_bounds_are_refused_offline_too(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=re.escape(message)):
        GpuSlicePolicySpec.model_validate(spec)


def test_numbers_at_their_bounds_parse_and_a_limit_in_bytes_saturates() -> None:
    spec = GpuSlicePolicySpec.model_validate({
        "slicing": {"mode": "memory", "sliceSize": MAX_MEMORY, "allowFullGpu": True},
        "gpuSelector": {"minMemory": MAX_MEMORY},
        "tenants": [{"namespace": "a", "maxSlices": MAX_COUNT, "maxFullGpus": MAX_COUNT}, {"namespace": "b", "maxSlices": 0}]})
    slices = DeviceKind("slice", "p.gpuslice.dev", spec.slicing.slice_bytes, "", "")
    full = DeviceKind("full", "full.p.gpuslice.dev", 16 * 1024**4, "", "-full")
    assert MAX_COUNT * 2 * 16 * 1024**4 > INT64_MAX
    assert limit_bytes(spec.tenants[0], [slices, full]) == INT64_MAX, "saturated: the status can always be written"
    assert limit_bytes(spec.tenants[1], [slices, full]) == 0
