"""The node agent's taint on a GPU being freed: every device of the GPU but the one kept for the
waiting claim, on this node only, and only until the move expires."""

from __future__ import annotations

import datetime

from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.planning.defrag.node_taints import freeing_on_node, with_defrag_taints
from gpuslice.planning.node.node_pool import plan_node_pool
from gpuslice.planning.node.pool_safety import with_statuses
from tests.unit.planning.cluster_state import gpus
from tests.unit.planning.defrag_state import INFERENCE

NOW = datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.UTC)


def move(node: str, gpu: str, device: str, expires: str = "2026-12-01T12:05:00Z",
         phase: str = "Tainting") -> dict[str, object]:
    return {"id": "m-1", "node": node, "gpu": gpu, "gpuTag": "x", "device": device, "expires": expires, "phase": phase,
            "claim": {"namespace": "team-a", "name": "big-gpu", "uid": "u"}, "pod": {"namespace": "team-a",
                                                                                  "name": "big", "uid": "p"}}


def test_every_device_of_the_gpu_but_the_kept_one_is_tainted_until_the_move_expires() -> None:
    found = gpus("n1", "h100-80gb", 2)
    plan = plan_node_pool({"kubernetes.io/hostname": "n1"}, found, [GpuSlicePolicy.from_body(INFERENCE)])
    keep = next(d["name"] for s in plan.slices for d in s.devices if d["name"].endswith("-full")
                and found[0].uuid in str(d["attributes"]))
    moves = [move("n1", found[0].uuid, keep), move("n2", found[1].uuid, "x"),
             move("n1", found[1].uuid, "y", expires="2026-12-01T11:59:59Z")]
    policy = {**INFERENCE, "status": {"defragmentation": {"inFlight": moves}}}
    freeing = freeing_on_node([policy], "n1", NOW)
    assert freeing == {found[0].uuid: (keep, "m-1")}, "other nodes' moves and expired ones taint nothing"
    tainted = {d["name"]: d.get("taints") for s in with_defrag_taints(with_statuses(plan.slices, {}), freeing)
               for d in s.devices}
    on_gpu = {n for n in tainted if n.startswith(keep.split("-inference")[0])}
    assert len(on_gpu) == 9
    assert tainted[keep] is None
    assert all(tainted[n] == [{"key": "gpuslice.dev/defrag", "value": "m-1", "effect": "NoSchedule"}]
               for n in on_gpu - {keep})
    assert all(t is None for n, t in tainted.items() if n not in on_gpu)
    again = with_defrag_taints(with_statuses(with_defrag_taints(plan.slices, freeing), {}), {})
    assert all("taints" not in d for s in again for d in s.devices), "the status step takes the taint off again"


def test_a_move_the_controller_has_not_taken_up_taints_nothing() -> None:
    """Whoever may request a move (the gpuslice-defrag role) adds it as Requested: it counts once the
    controller has judged it and moved it on."""
    requested = {k: v for k, v in move("n1", "GPU-1", "keep", phase="Requested").items() if k != "phase"}
    for recorded in (move("n1", "GPU-1", "keep", phase="Requested"), requested):
        policy = {**INFERENCE, "status": {"defragmentation": {"inFlight": [recorded]}}}
        assert freeing_on_node([policy], "n1", NOW) == {}
    for phase in ("Tainting", "Evicting", "Placing"):
        policy = {**INFERENCE, "status": {"defragmentation": {"inFlight": [move("n1", "GPU-1", "keep", phase=phase)]}}}
        assert freeing_on_node([policy], "n1", NOW) == {"GPU-1": ("keep", "m-1")}
