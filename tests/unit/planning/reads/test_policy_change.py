"""What an edit of a live policy would do, as the agents would do it."""

from __future__ import annotations

from typing import Any

from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.planning.reads.policy_change import ChangePlan, gpus_from_devices, plan_change
from gpuslice.planning.reads.status_report import Snapshot
from tests.unit.planning.cluster_state import INFERENCE, claim, devices_of, gpus, node_body, policy_body, published, tag

NODES = [node_body("n1", "h100-80gb", 1)]


def edit(body: dict[str, Any], **slicing: Any) -> GpuSlicePolicy:
    changed = {**body, "spec": {**body["spec"], "slicing": {**body["spec"]["slicing"], **slicing}},
               "metadata": {**body["metadata"], "generation": 2}}
    return GpuSlicePolicy.from_body(changed)


def change(policy: GpuSlicePolicy, claims: list[dict[str, Any]], live: list[dict[str, Any]] | None = None,
           node_gpus: dict[str, Any] | None = None) -> ChangePlan:
    live = live or [INFERENCE]
    snapshot = Snapshot(live, published("n1", "h100-80gb", 1, live), claims, NODES)
    return plan_change(policy, live, snapshot.pools(), NODES, node_gpus or {})


def test_a_resize_adds_drains_and_holds_what_a_claim_has() -> None:
    t = tag("n1")
    plan = change(edit(INFERENCE, sliceSize="20G"), [claim("team-a", "c", [("n1", f"{t}-inference-10g-3")],
                                                           pods=("web",))])
    [node] = plan.nodes
    assert [h.name for h in node.held] == [f"{t}-inference-10g-3"]
    assert node.held[0].removed
    assert node.held[0].holders[0].who == "team-a/web"
    assert node.drain_remove == tuple(sorted(f"{t}-inference-10g-{k}" for k in range(8) if k != 3))
    assert node.added == tuple(f"{t}-inference-20g-{k}" for k in range(4))
    assert node.unchanged == 1  # the whole GPU stays as it is
    counts = {c.policy: (c.before, c.after) for c in plan.counts}
    assert counts == {"inference": (9, 5)}
    assert plan.problems == ()
    assert not plan.new


def test_a_change_of_mode_waits_for_the_gpu() -> None:
    t = tag("n1")
    plain = policy_body("inference", {"mode": "memory", "sliceSize": "10G"})
    [node] = change(edit(plain, mode="shared"), [claim("team-a", "c", [("n1", f"{t}-inference-10g-0")])],
                    live=[plain]).nodes
    assert node.added == ()
    assert node.waiting == (f"{t}-inference-shared",)
    assert node.blocked_gpus == (gpus("n1", "h100-80gb")[0].uuid,)


def test_an_edit_that_changes_nothing_says_so() -> None:
    plan = change(edit(INFERENCE), [])
    assert plan.nodes == ()


def test_a_new_policy_that_conflicts_is_reported_as_the_controller_would() -> None:
    newcomer = GpuSlicePolicy.from_body(policy_body("newcomer", {"mode": "shared", "sliceSize": "10Gi"},
                                                    created="9999-12-31T23:59:59Z"))
    plan = change(newcomer, [])
    assert [p.reason for p in plan.problems] == ["ConflictingPolicy"]


def test_gpus_are_read_back_from_what_the_node_publishes() -> None:
    pool = Snapshot([INFERENCE], published("n1", "h100-80gb", 2, [INFERENCE])).pools()[0]
    found = gpus_from_devices(list(pool.devices), pool)
    assert [(g.uuid, g.index, g.memory, g.product_name, g.pci_bus_id, g.mig_profiles) for g in found] == [
        (g.uuid, g.index, g.memory, g.product_name, g.pci_bus_id, g.mig_profiles) for g in gpus("n1", "h100-80gb", 2)]


def test_a_static_mig_instances_uuid_is_no_change() -> None:
    """The agent publishes a static MIG device with its instance's UUID (as NVIDIA's driver does);
    the preview, planned without the instances, must not take that for a change."""
    layout = policy_body("layout", {"mode": "mig", "mig": {"layout": {"3g.20gb": 2}}})
    nodes = [node_body("n1", "a100-40gb", 1)]
    slices = published("n1", "a100-40gb", 1, [layout])
    for index, device in enumerate(devices_of(slices)):
        device["attributes"]["uuid"] = {"string": f"MIG-instance-{index}"}
    snapshot = Snapshot([layout], slices, [], nodes)
    plan = plan_change(edit(layout), [layout], snapshot.pools(), nodes, {})
    assert plan.nodes == (), "nothing changes"
