"""The occupancy map: each GPU's memory, segment by segment, from what the agents published."""

from __future__ import annotations

from gpuslice.inventory.catalog import MODELS
from gpuslice.planning.reads.occupancy import GpuMap, occupancy
from gpuslice.planning.reads.status_report import Snapshot, status_report
from tests.unit.planning.cluster_state import (
    H100,
    INFERENCE,
    claim,
    node_body,
    only_gpu,
    policy_body,
    published,
    tag,
    taint,
)

A100 = MODELS["a100-40gb"].memory
G = 10**9
GI = 2**30


def states(gpu: GpuMap) -> list[str]:
    return [s.state for s in gpu.segments]


def test_memory_slices_held_first_then_the_free_memory_in_slices_then_slack() -> None:
    t = tag("n1")
    claims = [claim("team-a", "c0", [("n1", f"{t}-inference-10g-5")], pods=("web-0",)),
              claim("team-b", "c1", [("n1", f"{t}-inference-10g-2")], pods=("job-1",))]
    gpu = only_gpu(Snapshot([INFERENCE], published("n1", "h100-80gb", 1, [INFERENCE]), claims))
    assert states(gpu) == ["allocated"] * 2 + ["free"] * 6 + ["slack"]
    assert [s.holder.who for s in gpu.segments[:2] if s.holder] == ["team-a/web-0", "team-b/job-1"]
    assert sum(s.span for s in gpu.segments) == gpu.memory == H100
    assert gpu.segments[-1].span == H100 - 8 * 10 * G
    assert gpu.offers == (), "the whole GPU is not free while slices of it are held"


def test_a_whole_gpu_fills_the_bar_and_nothing_else_is_free() -> None:
    t = tag("n1")
    gpu = only_gpu(Snapshot([INFERENCE], published("n1", "h100-80gb", 1, [INFERENCE]),
                            [claim("team-a", "big", [("n1", f"{t}-inference-full")], pods=("train",))]))
    assert states(gpu) == ["allocated"]
    assert gpu.segments[0].span == H100
    assert gpu.segments[0].kind == "full"


def test_an_idle_gpu_offers_itself_whole() -> None:
    gpu = only_gpu(Snapshot([INFERENCE], published("n1", "h100-80gb", 1, [INFERENCE])))
    assert gpu.offers == ("the whole GPU (inference)",)
    assert states(gpu) == ["free"] * 8 + ["slack"]


def test_two_memory_policies_share_the_free_memory() -> None:
    wide = policy_body("wide", {"mode": "memory", "sliceSize": "20G"}, created="2026-11-29T11:00:00Z")
    t = tag("n1")
    slices = published("n1", "h100-80gb", 1, [INFERENCE, wide])
    gpu = only_gpu(Snapshot([INFERENCE, wide], slices, [claim("team-c", "c", [("n1", f"{t}-wide-20g-0")])]))
    # 85.5 G: 20 G held, six 10 G slices of inference fit in the rest, and 5.5 G that no 20 G slice fits.
    assert states(gpu) == ["allocated"] + ["free"] * 6 + ["slack"]
    assert gpu.policies == ("inference", "wide")
    assert sum(s.span for s in gpu.segments) == H100


def test_pending_change_is_held_when_allocated_and_draining_when_free() -> None:
    t = tag("n1")
    slices = published("n1", "h100-80gb", 1, [INFERENCE])
    taint(slices, {f"{t}-inference-10g-0", f"{t}-inference-10g-1"}, "gpuslice.dev/pending-change")
    gpu = only_gpu(Snapshot([INFERENCE], slices, [claim("team-a", "c", [("n1", f"{t}-inference-10g-0")])]))
    assert states(gpu) == ["held", "free", "free", "free", "free", "free", "free", "draining", "slack"]


def test_an_unhealthy_gpu_is_tainted_whoever_holds_it() -> None:
    t = tag("n1")
    slices = published("n1", "h100-80gb", 1, [INFERENCE])
    everything = {d["name"] for s in slices for d in s["spec"].get("devices") or []}
    taint(slices, everything, "gpuslice.dev/unhealthy", "XID-79", "NoExecute")
    gpu = only_gpu(Snapshot([INFERENCE], slices, [claim("team-a", "c", [("n1", f"{t}-inference-10g-3")],
                                                        pods=("web",))]))
    assert states(gpu) == ["tainted"] * 8 + ["slack"]
    assert gpu.segments[0].holder is not None
    assert gpu.segments[0].holder.who == "team-a/web"
    assert gpu.tainted_reasons == ("unhealthy: XID-79",)


def test_a_policy_taint_from_a_device_taint_rule_reads_as_its_name() -> None:
    t = tag("n1")
    rule = {"spec": {"deviceSelector": {"driver": "gpu.gpuslice.dev", "pool": "n1", "device": f"{t}-inference-10g-0"},
                     "taint": {"key": "gpuslice.dev/maintenance", "value": "planned", "effect": "NoSchedule"}}}
    gpu = only_gpu(Snapshot([INFERENCE], published("n1", "h100-80gb", 1, [INFERENCE]), taint_rules=[rule]))
    assert [s.reasons for s in gpu.segments if s.state == "tainted"] == [("maintenance: planned",)]


def test_an_informing_taint_keeps_nothing_off() -> None:
    t = tag("n1")
    slices = published("n1", "h100-80gb", 1, [INFERENCE])
    taint(slices, {f"{t}-inference-10g-0"}, "example.com/note", effect="None")
    assert "tainted" not in states(only_gpu(Snapshot([INFERENCE], slices)))


def test_dynamic_mig_shows_placements_and_what_fits_in_the_free_slices() -> None:
    training = policy_body("training", {"mode": "mig", "mig": {"profiles": ["1g.5gb", "3g.20gb"]}})
    t = tag("n1", "a100-40gb")
    gpu = only_gpu(Snapshot([training], published("n1", "a100-40gb", 1, [training]),
                            [claim("ml", "c", [("n1", f"{t}-mig-3g20gb-at-4")], pods=("trainer",))]))
    assert [(s.state, s.placement) for s in gpu.segments] == [("free", (0, 4)), ("allocated", (4, 4))]
    assert gpu.segments[0].fits == ("1g.5gb", "3g.20gb")
    assert gpu.segments[1].memory == MODELS["a100-40gb"].mig_profile("3g.20gb").memory  # type: ignore[union-attr]
    assert sum(s.span for s in gpu.segments) == A100 // 8 * 8


def test_a_static_mig_layout_shows_each_instance() -> None:
    layout = policy_body("fixed", {"mode": "mig", "mig": {"layout": {"3g.20gb": 1, "1g.5gb": 4}}})
    gpu = only_gpu(Snapshot([layout], published("n1", "a100-40gb", 1, [layout])))
    assert [(s.kind, s.placement) for s in gpu.segments] == [
        ("1g.5gb", (0, 1)), ("1g.5gb", (1, 1)), ("1g.5gb", (2, 1)), ("1g.5gb", (3, 1)), ("3g.20gb", (4, 4))]


def test_shared_capacity_is_cut_by_what_each_claim_consumed() -> None:
    notebooks = policy_body("notebooks", {"mode": "shared", "sliceSize": "5Gi"})
    t = tag("n1", "l4")
    device = f"{t}-notebooks-shared"
    gpu = only_gpu(Snapshot([notebooks], published("n1", "l4", 1, [notebooks]), [
        claim("ds", "a", [("n1", device)], pods=("nb-a",), consumed="10Gi"),
        claim("ds", "b", [("n1", device)], pods=("nb-b",), consumed="5Gi")]))
    assert [(s.state, s.span) for s in gpu.segments] == [
        ("allocated", 10 * GI), ("allocated", 5 * GI), ("free", 5 * GI), ("slack", MODELS["l4"].memory - 20 * GI)]


def test_admin_access_claims_see_a_gpu_and_take_none_of_it() -> None:
    t = tag("n1")
    gpu = only_gpu(Snapshot([INFERENCE], published("n1", "h100-80gb", 1, [INFERENCE]),
                            [claim("gpu-monitoring", "dcgm", [("n1", f"{t}-inference-full")], admin=True)]))
    assert "allocated" not in states(gpu)
    assert [h.ref for h in gpu.admin] == ["gpu-monitoring/dcgm"]


def test_only_the_newest_generation_is_drawn_and_a_pool_being_rewritten_is_marked() -> None:
    old = published("n1", "h100-80gb", 1, [INFERENCE], generation=1)
    new = published("n1", "h100-80gb", 1, [INFERENCE], generation=2)[:1]  # the counter slice only, so far
    report = status_report(Snapshot([INFERENCE], old + new))
    [node] = report.map.nodes
    assert (node.generation, node.complete, node.gpus) == (2, False, ())
    assert any("rewriting" in note for note in report.notes)


def test_nodes_whose_gpus_publish_nothing_are_on_the_map() -> None:
    report = status_report(Snapshot([INFERENCE], published("n1", "h100-80gb", 1, [INFERENCE]),
                                    nodes=[node_body("n1", "h100-80gb", 2), node_body("n2", "l4", 4)]))
    assert [(n.name, len(n.gpus), n.gpus_without_devices) for n in report.map.nodes] == [("n1", 1, 1), ("n2", 0, 4)]


def test_other_drivers_slices_are_not_ours() -> None:
    foreign = published("n1", "h100-80gb", 1, [INFERENCE])
    for item in foreign:
        item["spec"]["driver"] = "gpu.nvidia.com"
    assert occupancy(Snapshot([INFERENCE], foreign).pools()).nodes == ()
