"""A GPU's MIG mode against the slicing mode that takes it (planning.node.mig_mode), and how what the
agent leaves out for it reaches the policy's status (planning.left_out, through the pool's slices)."""

from __future__ import annotations

from dataclasses import replace

from gpuslice.controller.changes import Changes
from gpuslice.controller.status import Findings, build_status
from gpuslice.controller.world import World
from gpuslice.dra.resourceslice import resource_slice
from gpuslice.planning.left_out import (
    ANNOTATION,
    MIG_MODE_OFF,
    MIG_MODE_ON,
    MIG_MODE_ON_OPERATOR,
    MIG_MODE_ON_RESET,
    LeftOut,
    decode,
    encode,
    left_out_annotations,
)
from gpuslice.planning.node.mig_mode import switches_mig_mode
from gpuslice.planning.node.node_pool import plan_node_pool
from gpuslice.planning.reads.usage import SliceView, Usage, slice_policies
from gpuslice.planning.selection import Selection
from tests.builders import policy_model as policy
from tests.unit.planning.node.one_node import LABELS, gpus

DYNAMIC = policy("dyn", {"mode": "mig", "mig": {"profiles": ["1g.5gb", "3g.20gb"]}})
LAYOUT = policy("lay", {"mode": "mig", "mig": {"layout": {"3g.20gb": 2}}})


def test_switches_mig_mode_from_hopper_on_as_nvidias_dra_driver() -> None:
    a100, h100, l4 = gpus("a100-40gb")[0], gpus("h100-80gb")[0], gpus("l4")[0]
    assert (switches_mig_mode(a100), switches_mig_mode(h100), switches_mig_mode(l4)) == (False, True, False)
    assert switches_mig_mode(replace(h100, architecture="Blackwell"))
    assert switches_mig_mode(replace(h100, architecture="Unknown")), "NVML's unknown (0xFFFFFFFF) >= Hopper"


def test_a_mig_policy_on_an_ampere_gpu_whose_mig_mode_is_off_publishes_nothing_and_says_why() -> None:
    """As NVIDIA's DRA driver (isDynamicMIGCapable): no dynamic MIG device on an A100 with MIG mode
    off, nor a static layout; with MIG mode on, both."""
    a100s = [replace(g, mig_enabled=False) for g in gpus("a100-40gb", 2)]
    a100s[1] = replace(a100s[1], mig_enabled=True)
    for mig in (DYNAMIC, LAYOUT):
        plan = plan_node_pool(LABELS, a100s, [mig])
        assert {d.gpu_uuid for d in plan.typed} == {a100s[1].uuid}, "only the GPU in MIG mode"
        assert plan.left_out == (LeftOut(mig.name, MIG_MODE_OFF, 0, "NVIDIA A100-SXM4-40GB"),)
        assert [n for n in plan.notes if "GPU 0" in n] == [
            f"{mig.name}: GPU 0 (NVIDIA A100-SXM4-40GB, Ampere) has MIG mode off and switches it only at a GPU"
            " reset, which gpuslice does not do: enable MIG mode on it (nvidia-smi -i 0 -mig 1, then nvidia-smi -r"
            " -i 0 with every client of the GPU stopped, or reboot the node); the agent publishes once it reads MIG"
            " mode on"]
        assert len(plan.counter_sets) == 1, "no counter set for the GPU left out"


def test_a_hopper_gpu_whose_mig_mode_is_off_takes_mig_policies() -> None:
    h100 = replace(gpus("h100-80gb")[0], mig_enabled=False)
    for mig in (policy("dyn", {"mode": "mig", "mig": {"profiles": ["1g.10gb"]}}),
                policy("lay", {"mode": "mig", "mig": {"layout": {"3g.40gb": 2}}})):
        plan = plan_node_pool(LABELS, [h100], [mig])
        assert plan.devices
        assert plan.left_out == ()


def test_what_is_left_out_travels_on_the_slices_and_is_read_back() -> None:
    items = [LeftOut("b", MIG_MODE_OFF, 1, "NVIDIA A100-SXM4-40GB"), LeftOut("a", MIG_MODE_OFF, 0, "X" * 100)]
    annotations = left_out_annotations(items)
    assert annotations[ANNOTATION] == encode(reversed(items)), "sorted: the same plan gives the same slice"
    assert decode(annotations) == (replace(items[1], product="X" * 64), items[0])
    assert left_out_annotations([]) == {}, "nothing left out: no annotation"
    for bad in ("{", "[]", '{"a": [["Unknown", 0, "x"]]}', '{"a": [["MigModeOff", "0", "x"]]}', '{"a": 3}'):
        assert decode({ANNOTATION: bad}) == (), bad
    manifest = resource_slice("n1", "uid", "devices-00", 3, 1, devices=[], annotations=annotations)
    view = SliceView.from_slice(manifest["spec"], manifest["metadata"]["annotations"])
    assert view.left_out == decode(annotations)
    assert view.policies == {"a", "b"}
    assert slice_policies(manifest["spec"], manifest["metadata"]["annotations"]) == {"a", "b"}


def _view(pool: str, generation: int, *items: LeftOut, devices: tuple[tuple[str, str], ...] = ()) -> SliceView:
    return SliceView(pool, generation, devices, left_out=tuple(items))


def test_the_controller_takes_the_newest_generation_of_the_nodes_the_policy_selects() -> None:
    a100 = "NVIDIA A100-SXM4-40GB"
    views = [_view("n1", 2, LeftOut("p", MIG_MODE_OFF, 0, a100)),
             _view("n1", 1, LeftOut("p", MIG_MODE_OFF, 1, a100)),  # an older generation
             _view("n2", 1, LeftOut("p", MIG_MODE_OFF, 3, a100), LeftOut("q", MIG_MODE_OFF, 3, a100)),
             _view("rogue", 1, LeftOut("p", MIG_MODE_OFF, 0, a100))]  # a node the policy does not select
    world = World(policies={}, namespaces={}, nodes={}, slices=views, claims=[])
    assert world.left_out("p", {"n1", "n2"}) == [("n1", LeftOut("p", MIG_MODE_OFF, 0, a100)),
                                                 ("n2", LeftOut("p", MIG_MODE_OFF, 3, a100))]
    status = build_status(policy("p", {"mode": "mig", "mig": {"profiles": ["1g.5gb"]}}),
                          Findings([], Selection(()), 0, Usage(), left_out=world.left_out("p", {"n1", "n2"})), "now")
    degraded = next(c for c in status.conditions if c.type == "Degraded")
    assert (degraded.status, degraded.reason) == ("True", "MigModeOff")
    assert degraded.message.startswith(f"MIG mode is off on node n1 GPU 0 ({a100}), node n2 GPU 3 ({a100}), and"
                                       " these GPUs (before Hopper, such as A100 and A30) switch it only at a GPU"
                                       " reset, which gpuslice does not do")
    assert ("Enable MIG mode on node n1: nvidia-smi -i 0 -mig 1, then nvidia-smi -r -i 0 with every client of the GPU"
            " stopped, or reboot the node; on node n2: nvidia-smi -i 3 -mig 1, then nvidia-smi -r -i 3") in degraded.message


def test_a_policy_no_longer_left_out_is_refreshed() -> None:
    """The slice that says a GPU is back no longer names the policy: the pool remembers it did."""
    changes = Changes()
    changes.take("p")
    assert changes.slice_seen(_view("n1", 1, LeftOut("p", MIG_MODE_OFF, 0, "x"))) == {"p"}
    assert changes.take("p")
    assert changes.slice_seen(_view("n1", 2, devices=(("d", "other"),))) == {"p", "other"}
    assert changes.take("p")
    assert changes.slice_seen(_view("n1", 3)) == set()


def test_a_whole_gpu_policy_on_a_gpu_in_mig_mode_publishes_nothing_and_says_why() -> None:
    """As NVIDIA's toolkit (no whole-GPU entry for a MIG-enabled GPU) and DRA driver (a full GPU only
    with MIG mode off): memory and shared policies leave a GPU in MIG mode out, whatever its
    architecture; the reason and the note say who switches it off: the agent from Hopper on, an admin
    with a reset before, the GPU Operator's MIG manager where it runs."""
    h100_on, a100_on = (replace(gpus(model)[0], mig_enabled=True) for model in ("h100-80gb", "a100-40gb"))
    operator = {**LABELS, "nvidia.com/gpu.deploy.mig-manager": "true"}
    for slicing in ({"mode": "memory", "sliceSize": "10Gi", "allowFullGpu": True},
                    {"mode": "shared", "sliceSize": "10Gi"}):
        whole = policy("w", slicing)
        for gpu, labels, reason, then in (
            (h100_on, LABELS, MIG_MODE_ON, "the agent destroys its MIG instances and switches MIG mode off once"
                                           " nothing of the GPU is published"),
            (a100_on, LABELS, MIG_MODE_ON_RESET, "the agent destroys its MIG instances once nothing of the GPU is"
                                                 " published; then switch MIG mode off (nvidia-smi -i 0 -mig 0, then"
                                                 " nvidia-smi -r -i 0 with every client of the GPU stopped, or"
                                                 " reboot the node)"),
            (h100_on, operator, MIG_MODE_ON_OPERATOR, "label the node nvidia.com/mig.config=all-disabled"),
        ):
            plan = plan_node_pool(labels, [gpu], [whole])
            assert (plan.devices, plan.counter_sets) == ([], [])
            assert plan.left_out == (LeftOut("w", reason, 0, gpu.product_name),)
            assert then in plan.notes[0]
            assert plan_node_pool(labels, [replace(gpu, mig_enabled=False)], [whole]).devices, "MIG mode off: published"


def _degraded(*found: tuple[str, LeftOut]) -> tuple[str, str]:
    status = build_status(policy("p", {"mode": "memory", "sliceSize": "10Gi"}),
                          Findings([], Selection(()), 0, Usage(), left_out=list(found)), "now")
    degraded = next(c for c in status.conditions if c.type == "Degraded")
    assert degraded.status == "True"
    return degraded.reason, degraded.message


def test_the_status_names_the_gpus_in_mig_mode_and_the_step_on_each_node() -> None:
    """The agent's own transition (Hopper) needs no step; before Hopper the message names each node's GPUs
    with the commands to run there; where the GPU Operator's MIG manager runs, the label to set. A step
    for a person outranks a transition under way, and both are said."""
    h100, a100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB"
    reason, message = _degraded(("n1", LeftOut("p", MIG_MODE_ON, 2, h100)))
    assert reason == "MigModeOn"
    assert message.startswith(f"MIG mode is on on node n1 GPU 2 ({h100}): a GPU in MIG mode cannot be used whole")
    assert "the agent destroys their MIG instances once no claim holds a device of them, switches MIG mode off" \
        " and publishes, with no step on the node" in message
    assert "nvidia-smi" not in message

    reason, message = _degraded(("n2", LeftOut("p", MIG_MODE_ON_RESET, 1, a100)),
                                ("n1", LeftOut("p", MIG_MODE_ON, 2, h100)),
                                ("n2", LeftOut("p", MIG_MODE_ON_RESET, 0, a100)),
                                ("n3", LeftOut("p", MIG_MODE_ON_RESET, 5, a100)))
    assert reason == "MigModeOnNeedsReset"
    assert message.startswith(f"MIG mode is on on node n2 GPU 1 ({a100}), node n2 GPU 0 ({a100}), node n3 GPU 5")
    assert ("Then switch MIG mode off on node n2: nvidia-smi -i 0 -mig 0 && nvidia-smi -i 1 -mig 0, then nvidia-smi"
            " -r -i 0,1 with every client of these GPUs stopped, or reboot the node; on node n3: nvidia-smi -i 5 -mig"
            " 0, then nvidia-smi -r -i 5 with every client of the GPU stopped, or reboot the node;") in message
    assert f"MIG mode is on on node n1 GPU 2 ({h100})" in message, "the transition under way is said too"

    reason, message = _degraded(*[(f"n{i:02d}", LeftOut("p", MIG_MODE_ON_OPERATOR, 0, h100)) for i in range(12)])
    assert reason == "MigModeOnByMigManager"
    assert ("has the final say on their MIG mode: kubectl label node n00 n01 n02 n03 n04 n05 n06 n07 n08 n09"
            " nvidia.com/mig.config=all-disabled --overwrite (and 2 more nodes)") in message
