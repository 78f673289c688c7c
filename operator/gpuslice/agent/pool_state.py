"""What a node's pool is built with besides its node, its client and its GPUs (``agent.pool``).

One object, so that whoever builds a pool (the agent, the bench's fleet, the tests) names each part
once: what the node keeps for it in its state directory (the record of what was last written, the
kubelet plugin's checkpoints, the MIG manager's applied layouts), the drains, and what the rest of the
agent tells it (the GPUs' health taints, the slicing modes the API server cannot serve).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpuslice.agent.drain import Drains
from gpuslice.agent.mig_manager import MigManager
from gpuslice.agent.node_state.checkpoint import Checkpoints
from gpuslice.agent.node_state.gpuops import GpuOps
from gpuslice.agent.published import PublishedRecord
from gpuslice.jsontypes import Object


@dataclass(frozen=True)
class PoolState:
    """``record``: what was last written (an empty pool, which the kubelet wiped, is taken to be what it
    says, so held devices come back unchanged). ``checkpoints``: the kubelet plugin's prepares, whose
    devices count as allocated whatever the claims say yet. ``mig``: makes static MIG layouts real
    (``mig_manager``: it adjusts the plan, adds its taints, and reconfigures a drained GPU after the
    write). The three are the node's, on disk (``kept_in``); without them the pool keeps nothing
    between processes. ``drains``: free devices change only once no claim can get them any more
    (``agent.drain``). ``statuses``: taints by GPU UUID (unhealthy) laid onto every device of the GPU,
    held ones included. ``unsupported``: slicing mode -> why the API server cannot serve it
    (``agent.startup``); such policies keep what they published."""

    record: PublishedRecord | None = None
    checkpoints: Checkpoints | None = None
    mig: MigManager | None = None
    drains: Drains = field(default_factory=Drains)
    statuses: Callable[[], Mapping[str, Sequence[Object]]] = dict
    unsupported: Mapping[str, str] | None = None

    @classmethod
    def kept_in(cls, state: Path, node: str, ops: GpuOps, *, boot_id: str | None = None,
                statuses: Callable[[], Mapping[str, Sequence[Object]]] = dict,
                drains: Drains | None = None) -> PoolState:
        """What the node keeps in ``state`` (created if missing): the record, the checkpoints (stamped
        with ``boot_id``) and the MIG manager's applied layouts."""
        state.mkdir(parents=True, exist_ok=True)
        return cls(PublishedRecord(state), Checkpoints(state, boot_id), MigManager(node, ops, state),
                   drains if drains is not None else Drains(), statuses)
