"""The controller's World answers from its indexes what it would answer from the whole fleet, and
keeps what it works out from the nodes only while they and the policy's spec are unchanged."""

from __future__ import annotations

from typing import Any

from gpuslice.api.resource import valid_policy
from gpuslice.controller.world import FleetMemo, World
from gpuslice.devcluster.nodes import fake_gpu_node
from gpuslice.planning.reads.usage import SliceView, devices_by_policy, slice_policies


def body(name: str, pool: str, generation: int = 1) -> dict[str, Any]:
    return {"apiVersion": "gpuslice.dev/v1alpha1", "kind": "GpuSlicePolicy",
            "metadata": {"name": name, "uid": f"u-{name}", "generation": generation,
                         "creationTimestamp": "2026-11-29T10:00:00Z"},
            "spec": {"slicing": {"mode": "memory", "sliceSize": "10Gi"}, "tenants": [{"namespace": "a"}],
                     "nodeSelector": {"matchLabels": {"pool": pool}}}}


def nodes(count: int) -> dict[str, dict[str, str]]:
    found = {}
    for i in range(count):
        labels = fake_gpu_node(f"n{i}", "h100-80gb", 8)["metadata"]["labels"]
        found[f"n{i}"] = {**labels, "pool": "x" if i % 2 else "y"}
    return found


def slice_spec(pool: str, generation: int, count: int, devices: list[tuple[str, str]]) -> dict[str, Any]:
    return {"pool": {"name": pool, "generation": generation, "resourceSliceCount": count},
            "devices": [{"name": d, "attributes": {"gpuslice.dev/policy": {"string": p}}} for d, p in devices]}


def test_a_policy_reads_every_slice_of_its_pools_and_only_those() -> None:
    specs = [
        slice_spec("n0", 2, 2, [("a0", "x")]),
        slice_spec("n0", 2, 2, [("b0", "y")]),  # same pool, other policy: decides n0 is complete
        slice_spec("n0", 1, 1, [("old", "x")]),  # an older generation, not counted
        slice_spec("n1", 3, 2, [("a1", "x")]),  # incomplete: its second slice is missing
        slice_spec("n2", 1, 1, [("c2", "y")]),
    ]
    views = [SliceView.from_slice(s) for s in specs]
    pools: dict[str, list[SliceView]] = {}
    policy_pools: dict[str, list[str]] = {}
    for spec, view in zip(specs, views, strict=True):
        pools.setdefault(view.pool, []).append(view)
        for name in slice_policies(spec):
            policy_pools.setdefault(name, []).append(view.pool)
    indexed = World(policies={}, namespaces={}, nodes={}, slices=views, claims=[], slice_pools=pools,
                    policy_pools=policy_pools)
    by_hand = World(policies={}, namespaces={}, nodes={}, slices=views, claims=[])
    for name in ("x", "y", "z"):
        assert devices_by_policy(indexed.slices_of(name)).get(name) == devices_by_policy(views).get(name)
        assert sorted(map(repr, indexed.slices_of(name))) == sorted(map(repr, by_hand.slices_of(name)))
    assert {v.pool for v in indexed.slices_of("x")} == {"n0", "n1"}
    assert indexed.slices_of("z") == []


def test_a_selection_is_kept_until_the_nodes_or_the_spec_change() -> None:
    memo = FleetMemo()
    fleet = nodes(4)
    policy = valid_policy(body("x", "x"))
    assert policy is not None
    first = World(policies={}, namespaces={}, nodes=fleet, slices=[], claims=[], nodes_version=1, memo=memo)
    assert [g.node for g in first.selection(policy).gpus] == ["n1", "n3"]
    # The same version: the memo answers (the version moves only once the node index holds the
    # labels it stands for: handlers.node_event), here even though the labels differ.
    moved = {**fleet, "n0": {**fleet["n0"], "pool": "x"}}
    same = World(policies={}, namespaces={}, nodes=moved, slices=[], claims=[], nodes_version=1, memo=memo)
    assert [g.node for g in same.selection(policy).gpus] == ["n1", "n3"]
    # A node's labels changed (Changes bumped the version): worked out again.
    later = World(policies={}, namespaces={}, nodes=moved, slices=[], claims=[], nodes_version=2, memo=memo)
    assert [g.node for g in later.selection(policy).gpus] == ["n0", "n1", "n3"]
    # The policy's spec changed (a new generation): worked out again.
    edited = valid_policy(body("x", "y", generation=2))
    assert edited is not None
    assert [g.node for g in later.selection(edited).gpus] == ["n2"]


def test_a_world_older_than_the_memo_neither_reads_nor_overwrites_it() -> None:
    """A handler that made its World before an await uses it after a newer one filled the memo."""
    memo = FleetMemo()
    fleet = nodes(4)
    moved = {**fleet, "n0": {**fleet["n0"], "pool": "x"}}
    policy = valid_policy(body("x", "x"))
    assert policy is not None
    old = World(policies={}, namespaces={}, nodes=fleet, slices=[], claims=[], nodes_version=1, memo=memo)
    new = World(policies={}, namespaces={}, nodes=moved, slices=[], claims=[], nodes_version=2, memo=memo)
    assert [g.node for g in new.selection(policy).gpus] == ["n0", "n1", "n3"]
    assert [g.node for g in old.selection(policy).gpus] == ["n1", "n3"]  # its own nodes, worked out
    assert memo.nodes_version == (2, 4)
    assert [g.node for g in new.selection(policy).gpus] == ["n0", "n1", "n3"], "the memo kept the newer answer"


def test_a_policy_that_does_not_parse_is_left_out_of_the_others() -> None:
    bad = body("bad", "x")
    bad["spec"]["slicing"] = {"mode": "nonsense"}
    good = body("good", "x")
    parsed = {"good": valid_policy(good), "bad": valid_policy(bad)}
    assert parsed["bad"] is None
    for world in (World(policies={"good": good, "bad": bad}, namespaces={}, nodes={}, slices=[], claims=[]),
                  World(policies={"good": good, "bad": bad}, namespaces={}, nodes={}, slices=[], claims=[],
                        parsed=parsed)):
        assert [p.name for p in world.parsed_policies()] == ["good"]


def test_the_nodes_a_policy_selects_are_those_its_node_selector_matches_with_gpus_or_an_agent() -> None:
    """status.selectedNodes: where the tenancy rule lets the policy's devices be allocated (H4 of the
    December review). Not judged by the GPU selector (the agent reads the GPUs), nor by who publishes."""
    labels = {**nodes(4), "plain": {"pool": "x"}, "agent-only": {"pool": "x"}, "elsewhere": {"pool": "y"}}
    views = [SliceView.from_slice(slice_spec(pool, 1, 1, [(f"d-{pool}", "x")])) for pool in ("agent-only", "elsewhere")]
    world = World(policies={}, namespaces={}, nodes=labels, slices=views, claims=[])
    policy = valid_policy(body("x", "x"))
    assert policy is not None
    # n1 and n3 have GPUs by their labels; agent-only has none by its labels but a gpuslice pool;
    # plain has neither; elsewhere publishes devices of x but x does not select it.
    assert world.nodes_selected(policy) == ("agent-only", "n1", "n3")
    gpu_filtered = valid_policy({**body("x", "x"), "spec": {**body("x", "x")["spec"],
                                                             "gpuSelector": {"products": ["NVIDIA L4"]}}})
    assert gpu_filtered is not None
    assert world.nodes_selected(gpu_filtered) == ("agent-only", "n1", "n3")


def test_a_reconcile_takes_the_indexs_parse_only_of_the_same_version_of_its_body() -> None:
    indexed = {**body("p", "x"), "metadata": {**body("p", "x")["metadata"], "resourceVersion": "7"}}
    kept = valid_policy(indexed)
    assert kept is not None
    world = World(policies={"p": indexed}, namespaces={}, nodes={}, slices=[], claims=[], parsed={"p": kept})
    assert world.policy_of(indexed) is kept
    newer = {**indexed, "metadata": {**indexed["metadata"], "resourceVersion": "8", "generation": 2}}
    assert world.policy_of(newer) is not kept
    assert world.policy_of(newer).metadata.generation == 2
    unversioned = body("p", "x")  # a body without a resourceVersion is never taken for the index's
    assert world.policy_of(unversioned) is not kept
