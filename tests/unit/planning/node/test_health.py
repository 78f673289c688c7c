"""GPU health with hysteresis, and health taints that never count as a change of a device (pure)."""

from __future__ import annotations

from gpuslice.agent.gpus.fake import FakeBackend
from gpuslice.planning.node.health import Fault, step, taint
from gpuslice.planning.node.node_pool import plan_node_pool
from gpuslice.planning.node.pool_safety import make_safe, with_statuses
from tests.builders import policy_model as policy

XID = Fault("xid", 48, "ECC page retirement")
LOST = Fault("lost")


def test_unhealthy_at_once_healthy_only_after_a_quiet_recovery_time() -> None:
    state = step({}, {"g": XID}, now=10, recovery=5)
    assert (state["g"].status, state["g"].reason, state["g"].since) == ("unhealthy", "XID-48", 10)
    assert taint(state["g"]) == {"key": "gpuslice.dev/unhealthy", "value": "XID-48", "effect": "NoSchedule"}
    state = step(state, {}, now=14, recovery=5)
    assert "g" in state, "still within the recovery time"
    state = step(state, {"g": XID}, now=14.5, recovery=5)  # it flaps: the clock starts again
    assert step(state, {}, now=19, recovery=5)["g"].last_fault == 14.5
    assert step(state, {}, now=19.5, recovery=5) == {}


def test_lost_is_worse_and_a_lesser_fault_does_not_downgrade_it() -> None:
    state = step({}, {"g": XID}, now=0, recovery=5)
    state = step(state, {"g": LOST}, now=1, recovery=5)
    assert (state["g"].status, state["g"].since) == ("lost", 1)
    assert taint(state["g"])["effect"] == "NoExecute"  # type: ignore[index]
    state = step(state, {"g": XID}, now=2, recovery=5)
    assert (state["g"].status, state["g"].last_fault) == ("lost", 2)


def test_health_taint_on_an_allocated_device_is_not_a_change() -> None:
    gpus = FakeBackend("n", [("h100-80gb", 1)]).discover()
    plan = plan_node_pool({}, gpus, [policy("p", {"mode": "memory", "sliceSize": "40G"})])
    sick = {gpus[0].uuid: [taint(step({}, {gpus[0].uuid: XID}, 0, 5)[gpus[0].uuid])]}
    published = [d for s in with_statuses(plan.slices, sick) for d in s.devices]  # type: ignore[arg-type]
    allocated = {published[0]["name"]}
    safe = make_safe(plan, published, plan.counter_sets, allocated, drained=set())
    assert (safe.held, safe.draining) == ((), ()), "a tainted device is the same device"
    healed = [d for s in with_statuses(safe.slices, {}) for d in s.devices]
    assert healed == plan.devices, "the taint goes when the GPU is healthy, and nothing else changes"
