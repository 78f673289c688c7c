"""The defragmentation planner: which GPU it frees, which pods it moves and why, what blocks the rest."""

from __future__ import annotations

from gpuslice.api.status import DefragMove, ObjectRef
from gpuslice.planning.defrag.model import waiting_pods
from gpuslice.planning.defrag.planner import plan_defrag
from tests.unit.planning.cluster_state import policy_body
from tests.unit.planning.defrag_state import Fleet


def fragmented() -> Fleet:
    """Four H100s: GPU 0 holds two movable pods, GPU 1 two with one bare, GPUs 2 and 3 three each."""
    fleet = Fleet()
    for gpu, owners in enumerate([["rs", "rs"], ["rs", "bare"], ["rs", "sts", "rs"], ["rs", "rs", "rs"]]):
        for owner in owners:
            fleet.run(gpu, owner)
    fleet.wait()
    return fleet


def test_the_gpu_with_the_fewest_movable_pods_is_freed_and_the_bare_pods_gpu_is_skipped() -> None:
    [plan] = fragmented().plans()
    assert plan.verdict == "Ready", plan.message
    assert plan.target is not None
    assert (plan.target.index, [m.pod for m in plan.target.moves]) == (0, ["team-a/rs-1", "team-a/rs-2"])
    assert plan.target.device.endswith("-inference-full")
    assert all(m.to.startswith("n1 GPU ") and m.to != "n1 GPU 0" for m in plan.target.moves)
    assert plan.target.moves[0].owner == "ReplicaSet web-1"
    by_gpu = {o.index: o for o in plan.alternatives}
    assert [b.code for b in by_gpu[1].blockers] == ["Bare"]
    assert "team-a/bare-4 is a bare pod" in by_gpu[1].blockers[0].message
    assert len(by_gpu[2].moves) == 3
    assert not by_gpu[2].blockers
    assert "the next best, n1 GPU 2, needs 3" in plan.message


def test_a_budget_that_allows_no_disruption_blocks_the_gpu_and_the_plan_says_so() -> None:
    fleet = fragmented()
    fleet.pods[0]["metadata"]["labels"] = {"app": "critical"}
    fleet.budget("critical", 0, {"app": "critical"})
    [plan] = fleet.plans()
    assert plan.target is not None
    assert plan.target.index == 2
    blocked = next(o for o in plan.alternatives if o.index == 0)
    assert [(b.code, b.subject) for b in blocked.blockers] == [("Disruption", "team-a/rs-1")]
    assert "PodDisruptionBudget team-a/critical allows no disruption" in blocked.blockers[0].message


def test_a_pod_two_budgets_select_is_not_moved_however_much_they_allow() -> None:
    """The Eviction API refuses (500) to evict a pod that more than one budget selects."""
    fleet = fragmented()
    fleet.pods[0]["metadata"]["labels"] = {"app": "web", "tier": "gpu"}
    fleet.budget("web", 5, {"app": "web"})
    fleet.budget("gpu", 5, {"tier": "gpu"})
    [plan] = fleet.plans()
    assert plan.target is not None
    assert plan.target.index == 2
    blocked = next(o for o in plan.alternatives if o.index == 0)
    assert [(b.code, b.subject) for b in blocked.blockers] == [("Disruption", "team-a/rs-1")]
    assert "team-a/web and team-a/gpu both select team-a/rs-1" in blocked.blockers[0].message


def test_a_budget_that_two_moves_together_would_exceed_blocks_them() -> None:
    fleet = fragmented()
    fleet.budget("web", 1, {"app": "web"})
    for pod in fleet.pods[2:]:
        pod["metadata"]["labels"] = {"app": "other"}
    [plan] = fleet.plans()
    assert plan.target is not None, plan
    assert plan.target.index == 2
    blocked = next(o for o in plan.alternatives if o.index == 0)
    assert blocked.blockers[0].code == "Disruption"
    assert "allows 1 disruptions now, and 2" in blocked.blockers[0].message


def test_opted_out_pods_and_namespaces_and_non_tenants_never_move() -> None:
    fleet = Fleet(gpus=3)
    fleet.run(0, pod_meta={"annotations": {"gpuslice.dev/defrag": "false"}})
    fleet.run(1, namespace="team-b")
    fleet.run(2, namespace="stranger")
    fleet.namespaces = [{"metadata": {"name": "team-b", "labels": {"gpuslice.dev/defrag": "false"}}}]
    fleet.wait()
    [plan] = fleet.plans()
    assert plan.verdict == "Blocked"
    codes = {o.index: [b.code for b in o.blockers] for o in plan.alternatives}
    assert codes == {0: ["OptedOut"], 1: ["OptedOut"], 2: ["NotATenant"]}


def test_jobs_daemonsets_mirror_pods_standalone_claims_and_other_owners_never_move() -> None:
    fleet = Fleet(gpus=5)
    fleet.run(0, "job")
    fleet.run(1, "ds")
    fleet.run(2, "rs", pod_meta={"annotations": {"kubernetes.io/config.mirror": "x"}})
    fleet.run(3, "rs", shared_claim=True)
    fleet.run(4, "custom")
    fleet.wait()
    [plan] = fleet.plans()
    assert plan.verdict == "Blocked"
    assert {o.index: o.blockers[0].code for o in plan.alternatives} == {
        0: "Job", 1: "DaemonSet", 2: "Mirror", 3: "StandaloneClaim", 4: "Owner"}


def test_no_move_when_a_device_is_free_and_none_when_the_fleet_lacks_the_memory() -> None:
    fleet = Fleet(gpus=2)
    fleet.run(0)
    fleet.wait()
    [plan] = fleet.plans()
    assert plan.verdict == "NotNeeded"
    assert "n1 GPU 1" in plan.message
    full = Fleet(gpus=2)
    for _ in range(5):
        full.run(0)
        full.run(1)
    full.wait()
    [plan] = full.plans()
    assert plan.verdict == "NoRoom", plan.message


def test_moved_pods_need_somewhere_to_go() -> None:
    fleet = Fleet(gpus=3)
    for _ in range(7):
        fleet.run(1)
    for _ in range(8):
        fleet.run(2)
    fleet.run(0)
    fleet.run(0)
    fleet.wait()
    [plan] = fleet.plans()
    assert plan.verdict == "Blocked", plan
    assert {b.code for o in plan.alternatives for b in o.blockers} == {"NowhereToGo"}


def test_a_large_slice_of_a_policy_sharing_the_gpu_needs_only_enough_moves() -> None:
    large = policy_body("large", {"mode": "memory", "sliceSize": "40G"}, tenants=[{"namespace": "team-a"}],
                        created="2026-11-29T11:00:00Z")
    fleet = Fleet(gpus=2, policies=[Fleet().policies[0], large])
    for _ in range(6):
        fleet.run(0)
    for _ in range(5):
        fleet.run(1)
    fleet.wait(device_class="large.gpuslice.dev")
    [plan] = fleet.plans()
    assert plan.verdict == "Ready", plan.message
    assert plan.target is not None
    assert plan.target.index == 1
    assert len(plan.target.moves) == 1, "5 x 10G on an 85.5 GB GPU: one move leaves 45.5 GB for a 40G slice"
    assert "-large-40g-" in plan.target.device


def test_mig_placements_are_freed_by_moving_the_instances_in_the_way() -> None:
    training = policy_body("training", {"mode": "mig", "mig": {"profiles": ["1g.5gb", "3g.20gb"]}},
                           tenants=[{"namespace": "team-a"}])
    fleet = Fleet(gpus=2, model="a100-40gb", policies=[training])
    for start in (0, 4):
        fleet.run(0, what=f"mig-1g5gb-at-{start}")
    for start in (0, 1, 4, 5):
        fleet.run(1, what=f"mig-1g5gb-at-{start}")
    fleet.wait(device_class="3g.20gb.training.gpuslice.dev")
    [plan] = fleet.plans()
    assert plan.verdict == "Ready", plan.message
    assert plan.target is not None
    assert plan.target.index == 0
    assert len(plan.target.moves) == 1
    assert plan.target.device.endswith("3g20gb-at-4") or plan.target.device.endswith("3g20gb-at-0")


def test_two_waiting_pods_get_two_gpus_and_the_second_sees_the_first_ones_moves() -> None:
    fleet = Fleet(gpus=4)
    fleet.run(0)
    fleet.run(1)
    fleet.run(1)
    for _ in range(3):
        fleet.run(2)
        fleet.run(3)
    fleet.wait("big-1", created="2026-12-01T01:00:00Z")
    fleet.wait("big-2", created="2026-12-01T02:00:00Z")
    first, second = fleet.plans()
    assert (first.pod, second.pod) == ("team-a/big-1", "team-a/big-2")
    assert first.target is not None
    assert second.target is not None
    # GPU 0's pod goes to GPU 1 (first fit), whose three pods (one not made yet) cannot be moved now.
    assert (first.target.index, second.target.index) == (0, 2)
    assert first.target.moves[0].to == "n1 GPU 1"
    assert [b.code for o in second.alternatives if o.index == 1 for b in o.blockers] == ["Incoming"]
    assert {m.to for m in second.target.moves} <= {"n1 GPU 1", "n1 GPU 3"}


def test_a_pod_already_being_freed_for_is_not_planned_again_and_its_gpu_is_off_limits() -> None:
    fleet = fragmented()
    move = DefragMove(id="m1", node="n1", gpu=fleet.gpu_uuid(0), gpu_tag="x", gpu_index=0, device="d",
                      claim=ObjectRef(namespace="team-b", name="other", uid="uid-other"),
                      pod=ObjectRef(namespace="team-b", name="other", uid="uid-o"), by="controller",
                      started="2026-12-01T00:00:00Z", expires="2026-12-01T00:05:00Z")
    cluster = fleet.cluster([move])
    [plan] = plan_defrag(cluster, waiting_pods(cluster.pods, cluster.claims, fleet.policies))
    assert plan.target is not None
    assert plan.target.index == 2
    assert any(b.code == "InFlight" for o in plan.alternatives for b in o.blockers)
    mine = move.model_copy(update={"claim": ObjectRef(namespace="team-a", name="big-gpu", uid="uid-big-gpu")})
    cluster = fleet.cluster([mine])
    [plan] = plan_defrag(cluster, waiting_pods(cluster.pods, cluster.claims, fleet.policies))
    assert plan.verdict == "InFlight"


def test_claims_asking_for_several_devices_are_listed_with_the_reason() -> None:
    fleet = fragmented()
    fleet.claims[-1]["spec"]["devices"]["requests"][0]["exactly"]["count"] = 2
    [plan] = fleet.plans()
    assert plan.verdict == "Unsupported"
    assert "more than one device" in plan.message
