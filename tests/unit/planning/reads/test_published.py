"""Reading the published pools: only a node's own slices count for it."""

from __future__ import annotations

import copy

from gpuslice.planning.reads.published import own_pool, read_pools
from tests.unit.planning.cluster_state import policy_body, published

POLICY = policy_body("inference", {"mode": "memory", "sliceSize": "10G"}, tenants=[{"namespace": "team-a"}])


def test_a_slice_another_node_publishes_under_this_nodes_pool_name_is_read_nowhere() -> None:
    """A kubelet may publish under any pool name (NodeRestriction checks only spec.nodeName): a newer
    generation from a rogue node would otherwise replace the real node's devices in ``gpuslice
    status`` and in the defragmentation planner, as it already does nothing in the controller."""
    real = published("gpu-1", "h100-80gb", 2, [POLICY])
    rogue = copy.deepcopy(real[0])
    rogue["metadata"]["name"] = "lure"
    rogue["spec"]["nodeName"] = "rogue"
    rogue["spec"]["pool"]["generation"] = 9
    assert own_pool(real[0]["spec"])
    assert not own_pool(rogue["spec"])
    [pool] = read_pools([*real, rogue])
    assert (pool.node, pool.generation, pool.complete) == ("gpu-1", 1, True)
    assert {d.node for d in pool.devices} == {"gpu-1"}
    assert read_pools([rogue]) == []
