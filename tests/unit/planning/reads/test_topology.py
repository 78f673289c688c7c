"""Where GPUs sit, which claims' GPUs sit together, and why an aligned claim waits (planning.reads.topology)."""

from __future__ import annotations

from typing import Any

from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.planning.aligned import AlignedTemplate, aligned_claim_spec, aligned_templates
from gpuslice.planning.modes import device_kinds
from gpuslice.planning.reads.pending import Facts, diagnose
from gpuslice.planning.reads.retry import to_retry
from gpuslice.planning.reads.status_report import Snapshot, status_report
from gpuslice.planning.selection import Selection
from tests.unit.planning.cluster_state import claim, devices_of, node_body, policy_body, published

TRAIN = policy_body("train", {"mode": "memory", "sliceSize": "40Gi", "allowFullGpu": True},
                    tenants=[{"namespace": "team-a"}],
                    topology={"counts": [4], "alignments": [{"match": ["NVLink", "NUMANode"]}]})
TRAIN["status"]["admittedTenants"] = [{"namespace": "team-a", "uid": "ns-a"}]
AWAY = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": "0/1 nodes are available: 1 cannot allocate all claims."}


def whole(slices: list[dict[str, Any]], index: int) -> str:
    """The whole-GPU device of GPU ``index``."""
    return next(d["name"] for d in devices_of(slices)
                if d["attributes"]["gpuslice.dev/index"]["int"] == index and d["name"].endswith("-full"))


def template(count: int = 4) -> AlignedTemplate:
    policy = GpuSlicePolicy.from_body(TRAIN)
    return next(t for t in aligned_templates(policy, policy.spec.tenants[0], device_kinds(policy, Selection(())))
                if t.count == count)


def waiting(name: str = "job") -> dict[str, Any]:
    return {"metadata": {"namespace": "team-a", "name": name}, "spec": aligned_claim_spec(template())}


def pod(name: str = "job") -> dict[str, Any]:
    return {"metadata": {"namespace": "team-a", "name": name, "uid": f"uid-{name}"},
            "spec": {"containers": [{"name": "c"}], "resourceClaims": [{"name": "gpu", "resourceClaimName": name}]},
            "status": {"phase": "Pending", "conditions": [AWAY]}}


def holding(slices: list[dict[str, Any]], *indexes: int) -> list[dict[str, Any]]:
    return [claim("team-a", f"hold-{i}", [("dgx", whole(slices, i))], pods=(f"p{i}",)) for i in indexes]


def report(slices: list[dict[str, Any]], claims: list[dict[str, Any]]) -> Any:
    return status_report(Snapshot([TRAIN], slices, claims, [node_body("dgx", "h100-80gb", 8,
                                                                        **{"gpuslice.dev/fake-system": "dgx-h100"})]))


def test_a_dgx_h100_node_by_what_its_gpus_share() -> None:
    slices = published("dgx", "dgx-h100", 8, [TRAIN])
    [node] = report(slices, []).topology
    assert [gpus for _, gpus in node.nvlink] == [(0, 1, 2, 3, 4, 5, 6, 7)]
    assert node.numa == ((0, (0, 1, 2, 3)), (1, (4, 5, 6, 7)))
    assert [gpus for _, gpus in node.pcie] == [(0, 1), (2, 3), (4, 5), (6, 7)]


def test_claims_on_several_gpus_say_what_their_gpus_share_and_what_was_granted() -> None:
    slices = published("dgx", "dgx-h100", 8, [TRAIN])
    four = claim("team-a", "four", [("dgx", whole(slices, i)) for i in (0, 1, 2, 3)])
    for result in four["status"]["allocation"]["devices"]["results"]:
        result["request"] = "gpus/nvlink-numa"
    pair = claim("team-a", "pair", [("dgx", whole(slices, 0)), ("dgx", whole(slices, 1))])
    split = claim("team-a", "split", [("dgx", whole(slices, 3)), ("dgx", whole(slices, 4))])
    single = claim("team-a", "single", [("dgx", whole(slices, 5))])
    found = {a.claim: a for a in report(slices, [four, pair, split, single]).aligned}
    assert set(found) == {"four", "pair", "split"}, "one GPU aligns with nothing"
    assert (found["four"].achieved, found["four"].granted, found["four"].gpus) == ("nvlink-numa", "nvlink-numa",
                                                                                   (0, 1, 2, 3))
    assert (found["pair"].achieved, found["pair"].granted) == ("nvlink-numa-pcie", "")
    assert found["split"].achieved == "nvlink", "one NVSwitch fabric, two NUMA nodes"


def test_an_aligned_claim_waits_when_only_a_misaligned_set_is_free_and_why_names_what_would_free_one() -> None:
    slices = published("dgx", "dgx-h100", 8, [TRAIN])
    held = holding(slices, 0, 1, 4, 5)  # free: 2, 3 (NUMA 0) and 6, 7 (NUMA 1)
    result = report(slices, [*held, waiting()])
    facts = Facts("team-a", pod(), claims={"job": waiting()}, namespace_uid="ns-a")
    diagnosis = diagnose(facts, [TRAIN], result.policies, result.map)
    said = {f.code: f.message for f in diagnosis.findings}
    assert [f.code for f in diagnosis.blocking] == ["NoAlignedSet"], diagnosis.findings
    assert "FreeDevices" not in said, "4 are free, but not 4 that sit together"
    message = said["NoAlignedSet"]
    assert "gpus/nvlink-numa: 4 x whole GPU of train are free, but no 4 of them on one node share an NVLink domain" \
           " and a NUMA node" in message
    assert "The most free ones that do: 2 (dgx, NVLink domain nvswitch-0000:05:00.0, NUMA node 0)" in message
    assert "Releasing team-a/hold-0, team-a/hold-1 would free 4 that do: dgx, NVLink domain" in message
    assert "(GPUs 0, 1 held)" in message
    assert to_retry([pod()], {"team-a/job": waiting()}, [TRAIN], result.map.gpus) == [], \
        "the scheduler is not asked to try again: nothing it can give is free"

    freed = report(slices, [*holding(slices, 4, 5), waiting()])  # hold-0 and hold-1 released
    diagnosis = diagnose(facts, [TRAIN], freed.policies, freed.map)
    assert not diagnosis.blocking
    assert "NUMA node 0" in next(f.message for f in diagnosis.findings if f.code == "AlignedFree")
    [retry] = to_retry([pod()], {"team-a/job": waiting()}, [TRAIN], freed.map.gpus)
    assert "NUMA node 0" in retry.fits


def test_no_node_with_enough_such_gpus_says_so() -> None:
    slices = published("dgx", "dgx-h100", 8, [TRAIN])
    spec = aligned_claim_spec(AlignedTemplate("x", template().kind, 5, template().alignments))
    job = {"metadata": {"namespace": "team-a", "name": "job"}, "spec": spec}
    result = report(slices, [job])
    diagnosis = diagnose(Facts("team-a", pod(), claims={"job": job}, namespace_uid="ns-a"), [TRAIN], result.policies,
                         result.map)
    message = next(f.message for f in diagnosis.findings if f.code == "NoAlignedSet")
    assert "no 5 of them on one node share" in message
    assert "No node of train has 5 such GPUs at all" in message


def test_status_shows_each_nodes_topology_and_the_claims_on_several_gpus_in_text_and_json() -> None:
    from rich.console import Console

    from gpuslice.inspect.commands import render_report
    from gpuslice.inspect.render.terminal import status_view

    slices = published("dgx", "dgx-h100", 8, [TRAIN])
    split = claim("team-a", "split", [("dgx", whole(slices, 3)), ("dgx", whole(slices, 4))])
    result = report(slices, [split])
    console = Console(width=160, record=True)
    console.print(status_view(result, 160))
    text = console.export_text()
    assert "Topology: GPUs by what they share" in text
    assert "0: GPUs 0,1,2,3" in text
    assert "nvswitch-0000:05:00.0: GPUs 0,1,2,3,4,5,6,7" in text
    assert "team-a/split" in text
    data = __import__("json").loads(render_report(result, "json") or "")
    assert data["aligned"] == [{"namespace": "team-a", "claim": "split", "node": "dgx", "gpus": [3, 4],
                                "achieved": "nvlink", "granted": ""}]
    assert data["topology"][0]["numa"] == [[0, [0, 1, 2, 3]], [1, [4, 5, 6, 7]]]


def test_only_constraints_that_bind_a_request_alone_are_its_own() -> None:
    from gpuslice.dra.wire import match_attributes

    spec = {"devices": {"requests": [{"name": "gpu"}, {"name": "nic"}], "constraints": [
        {"requests": ["gpu", "nic"], "matchAttribute": "resource.kubernetes.io/pcieRoot"},
        {"requests": ["gpu"], "matchAttribute": "resource.kubernetes.io/numaNode"},
        {"matchAttribute": "gpuslice.dev/nvlinkDomain"}]}}
    assert match_attributes(spec, "gpu") == ("resource.kubernetes.io/numaNode",), "the NIC's is not the GPU's alone"
    one = {"devices": {"requests": [{"name": "gpus"}], "constraints": [
        {"matchAttribute": "gpuslice.dev/nvlinkDomain"}, {"requests": ["gpus/numa"], "matchAttribute": "x/y"}]}}
    assert match_attributes(one, "gpus/numa") == ("gpuslice.dev/nvlinkDomain", "x/y")
    assert match_attributes(one, "gpus/nvlink") == ("gpuslice.dev/nvlinkDomain",)


def test_the_controller_counts_allocations_by_the_alignment_their_gpus_achieve() -> None:
    from gpuslice.api.status import GpuSlicePolicyStatus
    from gpuslice.controller.metrics import PolicyFigures, PolicyMetrics
    from gpuslice.planning.reads.usage import ClaimView, SliceView, device_info, devices_by_policy, usage

    slices = published("dgx", "dgx-h100", 8, [TRAIN])
    held = [claim("team-a", "four", [("dgx", whole(slices, i)) for i in (0, 1, 4, 5)]),
            claim("team-a", "pair", [("dgx", whole(slices, i)) for i in (2, 3)]),
            claim("team-a", "one", [("dgx", whole(slices, 7))])]
    views = [SliceView.from_slice(s["spec"]) for s in slices]
    claims = [v for c in held if (v := ClaimView.from_claim("team-a", c["metadata"]["name"], c["status"]))]
    found = usage(devices_by_policy(views)["train"], claims, device_info(views))
    assert found.alignments == {(4, "nvlink"): 1, (2, "nvlink-numa-pcie"): 1}, "0, 1, 4, 5: two NUMA nodes"
    metrics = PolicyMetrics()
    metrics.record("train", PolicyFigures(GpuSlicePolicyStatus(), alignments=found.alignments))
    [family] = [f for f in metrics.collect() if f.name == "gpuslice_policy_aligned_allocations"]
    assert {(s.labels["gpus"], s.labels["alignment"]): s.value for s in family.samples} == {
        ("4", "nvlink"): 1, ("2", "nvlink-numa-pcie"): 1}


def test_plan_on_the_cluster_sees_a_system_nodes_published_devices_as_unchanged() -> None:
    """The preview plans a fake server's GPUs from its labels with the server's layout: planning them as plain
    H100s would make every device look changed (no NUMA node or NVLink domain, other bus ids)."""
    from gpuslice.inspect.cluster_plan import fake_gpus
    from gpuslice.planning.reads.policy_change import plan_change

    slices = published("dgx", "dgx-h100", 8, [TRAIN])
    nodes = [node_body("dgx", "h100-80gb", 8, **{"gpuslice.dev/fake-system": "dgx-h100"})]
    snapshot = Snapshot([TRAIN], slices, [], nodes)
    edited = GpuSlicePolicy.from_body({**TRAIN, "spec": {**TRAIN["spec"], "tenants": [{"namespace": "team-b"}]}})
    change = plan_change(edited, [TRAIN], snapshot.pools(), nodes, fake_gpus(nodes))
    assert change.nodes == (), change.nodes
