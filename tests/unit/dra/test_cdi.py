"""CDI specs of prepared claims and the GPUSLICE_* variables each mode gives a container (pure)."""

from __future__ import annotations

from gpuslice.agent.gpus.fake import FakeBackend
from gpuslice.dra import cdi
from gpuslice.planning.devices import Device
from gpuslice.planning.grants import Grant
from gpuslice.planning.modes import environment
from gpuslice.planning.node.node_pool import plan_node_pool
from tests.builders import policy_model as policy


def devices(mode: str, **slicing: object) -> list[Device]:
    gpus = FakeBackend("n", [("a100-40gb" if mode == "mig" else "h100-80gb", 1)]).discover()
    return list(plan_node_pool({}, gpus, [policy("p", {"mode": mode, **slicing})]).typed)


def test_each_mode_tells_the_container_what_it_got() -> None:
    memory = devices("memory", sliceSize="10G", allowFullGpu=True)
    env = environment(Grant("ns/c", "gpu", memory[0]))
    assert env["GPUSLICE_MODE"] == "memory"
    assert env["GPUSLICE_SLICE_SIZE"] == "10G"
    assert env["GPUSLICE_MEMORY_LIMIT_BYTES"] == str(10**10)
    assert env["GPUSLICE_GPU_UUID"] == memory[0].gpu_uuid
    assert environment(Grant("ns/c", "gpu", memory[-1]))["GPUSLICE_SLICE_SIZE"] == "full"

    [shared] = devices("shared", sliceSize="5Gi")
    env = environment(Grant("ns/c", "gpu", shared, share_id="abc", consumed_memory=15 * 2**30))
    assert (env["GPUSLICE_MEMORY_LIMIT"], env["GPUSLICE_SHARE_ID"]) == ("15Gi", "abc")

    mig = devices("mig", mig={"profiles": ["3g.20gb"]})[1]
    env = environment(Grant("ns/c", "gpu", mig, mig_uuid="MIG-1", admin_access=True))
    assert (env["GPUSLICE_MIG_PROFILE"], env["GPUSLICE_MIG_PLACEMENT"], env["GPUSLICE_MIG_UUID"]) == (
        "3g.20gb", "4+4", "MIG-1")
    assert env["GPUSLICE_ADMIN_ACCESS"] == "true"


def test_claim_spec_is_deterministic_and_names_are_valid() -> None:
    edits = {cdi.device_name("uid-1", "gpu-1-x"): cdi.ContainerEdits(env={"B": "2", "A": "1"})}
    spec = cdi.claim_spec(edits, cdi.ContainerEdits(env={"C": "3"}))
    assert spec == {"cdiVersion": "0.6.0", "kind": "gpuslice.dev/gpu",
                    "devices": [{"name": "uid-1-gpu-1-x", "containerEdits": {"env": ["A=1", "B=2"]}}],
                    "containerEdits": {"env": ["C=3"]}}
    assert cdi.qualified("uid-1-gpu-1-x") == "gpuslice.dev/gpu=uid-1-gpu-1-x"
    assert cdi.claim_uid_of(cdi.spec_file_name("uid-1")) == "uid-1"
    assert cdi.claim_uid_of("nvidia.yaml") is None


def test_a_specs_devices_are_its_objects_and_a_malformed_field_reads_as_none() -> None:
    first, second = {"name": "a", "containerEdits": {}}, {"name": "b"}
    assert cdi.cdi_devices({"devices": [first, "b", None, second]}) == [first, second]
    for spec in ({}, {"devices": None}, {"devices": {"name": "a"}}, {"devices": "a"}):
        assert cdi.cdi_devices(spec) == []
        assert cdi.required_version({**spec, "kind": cdi.KIND}) == "0.3.0"
