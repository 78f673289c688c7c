"""The committed CRD is what the models generate, and the models parse what users write."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest

from gpuslice.api.crd import CRDS, crd, crd_yaml
from gpuslice.api.policy import GpuSlicePolicySpec, Tenant

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
