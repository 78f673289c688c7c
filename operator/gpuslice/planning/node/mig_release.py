"""A GPU whose MIG instances its policy no longer wants: what the agent destroys, and whether it then
switches MIG mode off (pure).

A GPU follows the policy that takes it now, whatever it served before. Its MIG instances serve only a
static layout (``planning.node.mig_layout``: the MIG manager makes the GPU match it) or the claims of
dynamic MIG (made at prepare, destroyed at unprepare). Any other instance is unwanted:

- a whole-GPU, memory or shared policy wants none, and MIG mode off (``planning.node.mig_mode``);
- dynamic MIG wants only the claims' own: a layout's instances left on the GPU would hold placements
  its devices offer as free;
- a GPU no policy takes keeps what is not gpuslice's: only the instances of the layout it last had
  (the MIG manager's record) go, and MIG mode stays as it is for whatever takes the GPU next.

The agent acts on a GPU only once nothing of it is published and no local checkpoint names it: its
old devices drained (the API server refuses them to claims, and the claims read after showed none),
so no claim holds an instance and none can be prepared on it. The GPU Operator's MIG manager, where it
runs, owns MIG on the node: then nothing here applies.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Literal

from gpuslice.inventory.gpus import Gpu
from gpuslice.planning.left_out import MIG_MODE_ON, MIG_MODE_ON_RESET
from gpuslice.planning.node.mig_layout import Instance
from gpuslice.planning.node.mig_mode import switches_mig_mode
from gpuslice.planning.node.node_pool import NodePlan

Wants = Literal["layout", "dynamic", "whole", "none"]


@dataclass(frozen=True)
class Release:
    """What the agent does to one GPU, in order: destroy these instances, then switch MIG mode off
    (``mig_off``; only once every one is gone); ``forget``: its applied layout's record goes."""

    gpu_uuid: str
    destroy: tuple[Instance, ...] = ()
    mig_off: bool = False
    forget: bool = False


def wants(plan: NodePlan, layouts: Collection[str], gpu: Gpu) -> Wants:
    """What the plan wants of ``gpu``: a static layout (``layouts``: the GPUs of one), dynamic MIG
    devices, the GPU whole (a whole-GPU, memory or shared policy, left out while MIG mode is on), or
    nothing."""
    if gpu.uuid in layouts:
        return "layout"
    planned = [d for d in plan.typed if d.gpu_uuid == gpu.uuid]
    if any(d.traits.instances for d in planned):
        return "dynamic"
    if planned or any(item.index == gpu.index and item.reason in (MIG_MODE_ON, MIG_MODE_ON_RESET)
                      for item in plan.left_out):
        return "whole"
    return "none"


def release(gpu: Gpu, want: Wants, recorded: Sequence[Instance] | None,
            instances: Sequence[Instance]) -> Release | None:
    """What to do to a GPU nothing of which is published or prepared (the caller's to check), whose
    instances are ``instances`` and whose last applied layout was ``recorded`` (None: none); None when
    it is as its policy wants it."""
    forget = recorded is not None
    if want == "whole":
        found = Release(gpu.uuid, tuple(sorted(instances)), gpu.mig_enabled and switches_mig_mode(gpu), forget)
    elif want == "dynamic":
        found = Release(gpu.uuid, tuple(sorted(instances)) if forget else (), False, forget)
    elif want == "none":
        found = Release(gpu.uuid, tuple(sorted(set(instances) & set(recorded or ()))), False, forget)
    else:
        return None
    return found if found.destroy or found.mig_off or found.forget else None
