"""The ``cli`` extra: what people's own commands need and the image leaves out."""

from __future__ import annotations

import importlib

import click


def _absent(module: str) -> bool:
    try:
        importlib.import_module(module)  # the command imports it next anyway
    except ImportError:
        return True
    return False


def need_cli_extra(command: str, modules: tuple[str, ...] = ("rich",)) -> None:
    """The commands people run need the ``cli`` extra, which the image leaves out; say so plainly."""
    missing = [m for m in modules if _absent(m)]
    if missing:
        raise click.ClickException(
            f"`{command}` needs the cli extra ({' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not"
            " installed here): pipx install"
            " 'gpuslice[cli]' (or pip install 'gpuslice[cli]'). The gpuslice image has only the controller and"
            " the agent.")
