"""A move someone requested is taken up only if it is the very move the planner would make for its
claim now: a claim no pod waits for, another policy's claim, another GPU, other or more pods to
evict, a pod the scheduler did not turn away for devices: each refused, with the reason."""

from __future__ import annotations

import datetime

import pytest

from gpuslice.api.status import DefragMove, ObjectRef
from gpuslice.controller.defrag.move import new_move
from gpuslice.planning.defrag.model import waiting_pods
from gpuslice.planning.defrag.request import refusal
from tests.unit.planning.defrag_state import INFERENCE, Fleet

NOW = datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.UTC)


def fleet() -> Fleet:
    """GPU 0 holds two movable pods, GPU 1 three, GPUs 2 and 3 four each: freeing GPU 0 moves two."""
    made = Fleet()
    for gpu, count in enumerate([2, 3, 4, 4]):
        for _ in range(count):
            made.run(gpu)
    made.wait()
    return made


def judged(made: Fleet, move: DefragMove, policy: str = "inference") -> str | None:
    cluster = made.cluster(in_flight=[move])
    return refusal(move, policy, cluster, waiting_pods(cluster.pods, cluster.claims, made.policies,
                                                      made.namespace_uids, made.ledgers))


def planned(made: Fleet) -> DefragMove:
    [plan] = made.plans()
    assert plan.ready, plan.message
    return new_move(plan, "gpuslice defrag (alice)", NOW, 300)


def test_the_planners_own_move_is_taken_up() -> None:
    made = fleet()
    move = planned(made)
    assert [v.name for v in move.evictions] == ["rs-1", "rs-2"]
    assert judged(made, move) is None


@pytest.mark.parametrize(("change", "said"), [
    ({"claim": ObjectRef(namespace="team-b", name="idle", uid="u-idle")},
     "not an unallocated claim of GpuSlicePolicy inference's devices that a pending pod"),
    ({"pod": ObjectRef(namespace="team-a", name="nobody", uid="u-nobody")}, "is waited for by pod team-a/big"),
    ({"evictions": []}, "would move team-a/rs-1, team-a/rs-2, not no pod"),
    ({"evictions": [ObjectRef(namespace="team-a", name="rs-3", uid="uid-rs-3")]}, "not team-a/rs-3"),
    ({"device": "gpu-x-inference-full"}, "the device it would keep for team-a/big is"),
])
def test_anything_else_is_refused_with_the_reason(change: dict[str, object], said: str) -> None:
    made = fleet()
    move = planned(made).model_copy(update=change)
    why = judged(made, move)
    assert why is not None
    assert said in why


def test_another_gpu_is_taken_up_only_with_the_pods_the_planner_would_move_there() -> None:
    """``gpuslice defrag`` plans every waiting pod at once, so its GPU for one may be the controller's
    second: taken up, with exactly the moves that free it; not with fewer, not a GPU it cannot free."""
    made = fleet()
    move = planned(made)
    [plan] = made.plans()
    gpu1 = next(o for o in plan.alternatives if o.index == 1)
    other = move.model_copy(update={"gpu": gpu1.uuid, "gpu_tag": gpu1.tag, "device": gpu1.device, "evictions": [
        ObjectRef(namespace="team-a", name=m.pod.split("/")[1], uid=m.uid) for m in gpu1.moves]})
    assert judged(made, other) is None
    assert "would move team-a/rs-3, team-a/rs-4, team-a/rs-5, not team-a/rs-1, team-a/rs-2" in str(judged(
        made, other.model_copy(update={"evictions": move.evictions})))
    assert "and no GPU GPU-none" in str(judged(made, move.model_copy(update={"gpu": "GPU-none"})))


def test_a_move_in_another_policy_or_for_a_gated_pod_is_refused() -> None:
    other = {**INFERENCE, "metadata": {**INFERENCE["metadata"], "name": "other"}}
    made = fleet()
    made.policies.append(other)
    move = planned(made)
    assert "not an unallocated claim of GpuSlicePolicy other's" in str(judged(made, move, policy="other"))
    gated = fleet()
    gated.pods[-1]["spec"]["schedulingGates"] = [{"name": "hold"}]
    assert "gpuslice would free no GPU for team-a/big" in str(judged(gated, move))
