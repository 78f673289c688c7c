"""Static MIG layouts: which GPUs must match one, the steps that get them there and back (pure), and
what `gpuslice plan --from` shows."""

from __future__ import annotations

from pathlib import Path

from gpuslice.agent.gpus.fake import FakeBackend
from gpuslice.planning.node.mig_layout import Step, devices_of, inverse, layout_targets, steps
from gpuslice.planning.node.node_pool import plan_node_pool
from gpuslice.preview import preview
from tests.builders import policy_model as policy

SIZES = {"1g.5gb": 1, "3g.20gb": 4, "7g.40gb": 8}


def test_steps_enable_destroy_then_create_largest_first_and_undo_in_reverse() -> None:
    todo = steps(False, [("1g.5gb", 0), ("1g.5gb", 4)], [("1g.5gb", 0), ("3g.20gb", 4), ("1g.5gb", 1)], SIZES)
    assert todo == [Step("enable-mig"), Step("destroy", "1g.5gb", 4), Step("create", "3g.20gb", 4),
                    Step("create", "1g.5gb", 1)]
    assert inverse(todo[:3]) == [Step("destroy", "3g.20gb", 4), Step("create", "1g.5gb", 4)]
    assert steps(True, [("7g.40gb", 0)], [("7g.40gb", 0)], SIZES) == []


def test_targets_are_static_layout_gpus_only_and_devices_follow_real_instances() -> None:
    gpus = FakeBackend("n", [("a100-40gb", 2)]).discover()
    static = policy("static", {"mode": "mig", "mig": {"layout": {"3g.20gb": 2}}},
                    gpuSelector={"products": ["NVIDIA A100-SXM4-40GB"]})
    plan = plan_node_pool({}, gpus, [static])
    targets = layout_targets(plan.typed, [static])
    assert {t.instances for t in targets.values()} == {(("3g.20gb", 0), ("3g.20gb", 4))}
    dynamic = policy("dyn", {"mode": "mig", "mig": {"profiles": ["3g.20gb"]}})
    assert layout_targets(plan_node_pool({}, gpus, [dynamic]).typed, [dynamic]) == {}
    real = devices_of(gpus[0], static, [("1g.5gb", 2), ("3g.20gb", 4), ("9g.99gb", 0)])
    assert [(d.profile, d.placement) for d in real] == [("1g.5gb", (2, 1)), ("3g.20gb", (4, 4))]


def test_plan_shows_the_reconfiguration_a_layout_change_implies(tmp_path: Path) -> None:
    old, new = tmp_path / "old.yaml", tmp_path / "new.yaml"
    body = ("apiVersion: gpuslice.dev/v1alpha1\nkind: GpuSlicePolicy\nmetadata: {name: t}\n"
            "spec: {slicing: {mode: mig, mig: {layout: LAYOUT}}, tenants: [{namespace: ml}]}\n")
    old.write_text(body.replace("LAYOUT", '{"7g.40gb": 1}'))
    new.write_text(body.replace("LAYOUT", '{"3g.20gb": 2}'))
    text = preview([new], "a100-40gb:1", "n", {}, [old])
    assert ("#   GPU 0 (NVIDIA A100-SXM4-40GB): destroy 7g.40gb at memory slice 0; create 3g.20gb at memory slice 0;"
            " create 3g.20gb at memory slice 4") in text.splitlines()
