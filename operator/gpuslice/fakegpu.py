"""``gpuslice fake-gpu``: make things happen to a fake node's GPUs while its agent runs.

It edits the fake GPUs' state file in the agent's state directory (``fake_state``),
which the agent reads on every call: a fault raised here is seen at the agent's next
health check, a failure injected here hits the next matching operation. For tests,
the demo, and anyone trying gpuslice on kind who wants to see a GPU fail.

On a node of the mock NVML library (the agent's state directory links to its state,
``mocknvml.STATE_LINK``) it edits the library's state instead, which every process that
loads the library reads: a fault is an XID or ECC event NVML delivers once (or a GPU lost,
until ``clear``), a failure is an NVML call answering NVML_ERROR_UNKNOWN.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import click

from gpuslice.agent.gpus.fake_state import (
    OPERATIONS,
    FakeFault,
    FakeProcess,
    FakeState,
    FakeStateFile,
    InjectedFailure,
    reset,
    set_mig_mode,
)
from gpuslice.devcluster import mocknvml
from gpuslice.devcluster.mocknvml import MockState, MockStateFile
from gpuslice.devcluster.state import default_state_dir
from gpuslice.dra.quantity import quantity_bytes


def _state_dir(state_dir: Path | None, node: str | None, dev_cluster: Path | None) -> Path:
    if state_dir is not None:
        return state_dir
    if node is None:
        click.echo("fake-gpu: give --state-dir (the agent's) or --node (a dev cluster's node).", err=True)
        sys.exit(2)
    return (dev_cluster or default_state_dir()) / "nodes" / node / "agent"


def _state(context: click.Context) -> FakeStateFile | MockStateFile:
    """The state file the group's options name, checked only when a subcommand runs: a group callback
    that exits would run before, and so break, ``fake-gpu SUBCOMMAND --help``. The mock NVML library's
    where the agent's state directory links to it."""
    directory = _state_dir(*context.obj)
    if not directory.is_dir():
        click.echo(f"fake-gpu: {directory} does not exist: no fake-backend agent keeps its state there.", err=True)
        sys.exit(1)
    if (directory / mocknvml.STATE_LINK).is_dir():
        return MockStateFile((directory / mocknvml.STATE_LINK).resolve())
    return FakeStateFile(directory)


@click.group("fake-gpu")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="The agent's --state-dir.")
@click.option("--node", default=None, help="A dev cluster's node (its agent's state is nodes/NODE/agent).")
@click.option("--dev-cluster-state", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="The dev cluster's --state-dir [default: ~/.local/state/gpuslice/dev-cluster].")
@click.pass_context
def fake_gpu(context: click.Context, state_dir: Path | None, node: str | None, dev_cluster_state: Path | None) -> None:
    """Raise faults on a fake node's GPUs, make operations fail, or show their state."""
    context.obj = (state_dir, node, dev_cluster_state)


def _update(context: click.Context, change: object, mock: Callable[[MockState, dict[str, object]], None]) -> None:
    """``change`` on the fake backend's state, or ``mock`` (with the node's config) on the mock library's."""
    state = _state(context)
    try:
        if isinstance(state, MockStateFile):
            config = state.config
            state.update(lambda s: mock(s, config))
        else:
            state.update(change)  # type: ignore[arg-type]
    except ValueError as error:
        click.echo(f"fake-gpu: {error}", err=True)
        sys.exit(1)


def _said(context: click.Context, change: Callable[[FakeState], str],
          mock: Callable[[MockState, dict[str, object]], str]) -> None:
    """``_update``, printing what ``change`` (or ``mock``) says, as nvidia-smi does."""
    said: list[str] = []
    _update(context, lambda s: said.append(change(s)), lambda s, config: said.append(mock(s, config)))
    click.echo(said[0])


@fake_gpu.command()
@click.argument("gpu", type=int)
@click.option("--xid", type=int, default=None, help="An XID error (79: fell off the bus, which also loses the GPU).")
@click.option("--ecc", is_flag=True, help="A double-bit ECC error.")
@click.option("--lost", is_flag=True, help="The GPU is gone: its work cannot continue (NoExecute).")
@click.option("--message", default="", help="What happened, in words.")
@click.pass_context
def fault(context: click.Context, gpu: int, xid: int | None, ecc: bool, lost: bool, message: str) -> None:
    """Raise a fault on GPU (by index); it stays until `clear`."""
    if sum((xid is not None, ecc, lost)) != 1:
        click.echo("fake-gpu fault: give exactly one of --xid N, --ecc, --lost.", err=True)
        sys.exit(2)
    kind = "lost" if lost or xid == 79 else ("ecc" if ecc else "xid")
    raised = FakeFault(kind=kind, code=xid, message=message)  # type: ignore[arg-type]
    _update(context, lambda s: s.faults.__setitem__(gpu, raised),
            lambda s, config: mocknvml.raise_fault(s, config, gpu, kind, xid))


@fake_gpu.command()
@click.argument("gpu", type=int)
@click.pass_context
def clear(context: click.Context, gpu: int) -> None:
    """Clear GPU's fault (the agent lifts its taint after the recovery time)."""
    _update(context, lambda s: s.faults.pop(gpu, None), lambda s, config: mocknvml.clear_fault(s, config, gpu))


@fake_gpu.command()
@click.argument("operation", type=click.Choice(OPERATIONS))
@click.option("--gpu", type=int, default=None, help="Only on this GPU [default: any].")
@click.option("--times", type=int, default=1, show_default=True, help="How many calls fail; -1: every one.")
@click.pass_context
def fail(context: click.Context, operation: str, gpu: int | None, times: int) -> None:
    """Make the next calls of OPERATION fail."""
    failure = InjectedFailure(operation=operation, gpu=gpu, remaining=times)  # type: ignore[arg-type]
    _update(context, lambda s: s.failures.append(failure),
            lambda s, _: mocknvml.inject_failure(s, operation, gpu, times))


@fake_gpu.command()
@click.argument("gpu", type=int)
@click.option("--pid", type=int, required=True, help="The process, in the node's PID namespace (a container's"
              " process as the host sees it: the agent maps it to its pod through /proc/PID/cgroup).")
@click.option("--memory", required=True, help="Device memory it uses, a quantity (12Gi); 0: it stops using the GPU.")
@click.option("--sm", type=click.FloatRange(0, 100), default=0.0, show_default=True,
              help="Percent of the GPU's SMs it keeps busy.")
@click.pass_context
def use(context: click.Context, gpu: int, pid: int, memory: str, sm: float) -> None:
    """Make process PID use GPU (by index), as NVML would list it; the agent's next usage pass sees it."""
    try:
        used = quantity_bytes(memory)
    except ValueError:
        click.echo(f"fake-gpu use: --memory {memory!r} is not a quantity such as 12Gi", err=True)
        sys.exit(2)

    def change(state: FakeState) -> None:
        state.processes = [p for p in state.processes if (p.gpu, p.pid) != (gpu, pid)]
        if used > 0:
            state.processes.append(FakeProcess(gpu=gpu, pid=pid, memory=used, sm=sm / 100))

    _update(context, change, lambda s, config: mocknvml.use(s, config, gpu, pid, used, sm / 100))


@fake_gpu.command("mig-mode")
@click.argument("gpu", type=int)
@click.argument("mode", type=click.Choice(["on", "off"]))
@click.pass_context
def mig_mode(context: click.Context, gpu: int, mode: str) -> None:
    """Switch GPU's MIG mode as nvidia-smi -i GPU -mig 1|0 does (off is refused while it has MIG instances):
    at once from Hopper on; before Hopper pending until the GPU is reset (fake-gpu reset GPU). The agent
    reads it at its next cycle."""
    _said(context, lambda s: set_mig_mode(s, gpu, mode == "on"),
          lambda s, config: mocknvml.set_mig_mode(s, config, gpu, mode == "on"))


@fake_gpu.command("reset")
@click.argument("gpus", type=int, nargs=-1, required=True)
@click.pass_context
def reset_gpus(context: click.Context, gpus: tuple[int, ...]) -> None:
    """Reset GPUS as nvidia-smi -r -i GPU,... does: refused while a process uses one; a pending MIG mode
    becomes current, and MIG instances do not survive it."""
    _said(context, lambda s: "\n".join(reset(s, gpu) for gpu in gpus),
          lambda s, config: "\n".join(mocknvml.reset(s, config, gpu) for gpu in gpus))


@fake_gpu.command("heal")
@click.pass_context
def heal(context: click.Context) -> None:
    """Clear every fault, injected failure and process."""
    def change(state: FakeState) -> None:
        state.faults.clear()
        state.failures.clear()
        state.processes.clear()

    _update(context, change, lambda s, _: mocknvml.heal(s))


@fake_gpu.command()
@click.pass_context
def show(context: click.Context) -> None:
    """Print the fake GPUs' state: MIG mode and instances, faults, injected failures, processes."""
    state = _state(context)
    found = state.read()
    click.echo(found.model_dump_json(indent=2, by_alias=isinstance(state, MockStateFile)))
