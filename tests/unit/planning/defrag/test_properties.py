"""Properties of the defragmentation planner over random fragmented fleets: it never proposes to
move a pod that may not move, and its moves are the fewest, checked by brute force."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslice.inventory.catalog import MODELS
from tests.unit.planning.cluster_state import policy_body
from tests.unit.planning.defrag_state import INFERENCE, Fleet

G = 10**9
H100 = MODELS["h100-80gb"].memory
LARGE = policy_body("large", {"mode": "memory", "sliceSize": "40G"}, tenants=[{"namespace": "team-a"}],
                    created="2026-11-29T11:00:00Z")
OWNERS = ["rs", "rs", "rs", "sts", "job", "ds", "bare"]
pods = st.fixed_dictionaries({
    "owner": st.sampled_from(OWNERS),
    "namespace": st.sampled_from(["team-a", "team-a", "team-a", "stranger"]),
    "opted_out": st.sampled_from([False, False, False, True]),
    "app": st.sampled_from(["web", "api", "db"]),
})
fleets = st.fixed_dictionaries({
    "gpus": st.lists(st.lists(pods, max_size=7), min_size=2, max_size=3),
    "large": st.booleans(),
    "budgets": st.dictionaries(st.sampled_from(["web", "api", "db"]), st.integers(0, 2), max_size=2),
})


def build(spec: dict[str, Any]) -> tuple[Fleet, dict[str, dict[str, Any]]]:
    fleet = Fleet(gpus=len(spec["gpus"]), policies=[INFERENCE, LARGE] if spec["large"] else [INFERENCE])
    facts: dict[str, dict[str, Any]] = {}
    for index, gpu in enumerate(spec["gpus"]):
        for pod in gpu:
            meta = {"annotations": {"gpuslice.dev/defrag": "false"}} if pod["opted_out"] else None
            name = fleet.run(index, pod["owner"], pod["namespace"], labels={"app": pod["app"]}, pod_meta=meta)
            facts[f"{pod['namespace']}/{name}"] = {**pod, "gpu": index}
    for app, allowed in spec["budgets"].items():
        fleet.budget(app, allowed, {"app": app})
    fleet.wait(device_class="large.gpuslice.dev" if spec["large"] else "full.inference.gpuslice.dev")
    return fleet, facts


def movable(pod: dict[str, Any], budgets: dict[str, int]) -> bool:
    return (pod["owner"] in ("rs", "sts") and pod["namespace"] == "team-a" and not pod["opted_out"]
            and budgets.get(pod["app"], 1) > 0)


def brute_force(spec: dict[str, Any], facts: dict[str, dict[str, Any]]) -> int | None:
    """The fewest moves that make room on one GPU, trying every GPU and every set of its pods."""
    counts = [len(g) for g in spec["gpus"]]
    best: int | None = None
    for index, count in enumerate(counts):
        on_gpu = [ref for ref, pod in facts.items() if pod["gpu"] == index]
        for size in range(count + 1):
            for chosen in itertools.combinations(on_gpu, size):
                staying = count - size
                if not spec["large"] and staying:  # a whole GPU: nothing may stay
                    continue
                if spec["large"] and H100 - staying * 10 * G < 40 * G:  # a 40G slice: 4 x 10G may stay
                    continue
                if not all(movable(facts[r], spec["budgets"]) for r in chosen):
                    continue
                if any(sum(facts[r]["app"] == app for r in chosen) > allowed
                       for app, allowed in spec["budgets"].items()):
                    continue
                room = sum(min(8 - c, (H100 - c * 10 * G) // (10 * G)) for i, c in enumerate(counts) if i != index)
                if size > room:
                    continue
                best = size if best is None else min(best, size)
    return best


@settings(max_examples=150, deadline=None)
@given(fleets)
def test_never_moves_an_unmovable_pod_and_moves_the_fewest(spec: dict[str, Any]) -> None:
    fleet, facts = build(spec)
    [plan] = fleet.plans()
    fewest = brute_force(spec, facts)
    options = [o for o in (plan.target, *plan.alternatives) if o is not None]
    for option in options:
        for move in option.moves:
            assert movable(facts[move.pod], spec["budgets"]), (move, plan)
    if plan.verdict == "NotNeeded":
        assert fewest == 0
    elif plan.verdict == "Ready":
        assert plan.target is not None
        assert len(plan.target.moves) == fewest, (plan, fewest)
        assert plan.target.exact
    else:
        assert plan.verdict in ("Blocked", "NoRoom"), plan
        assert fewest is None, (plan, fewest)
