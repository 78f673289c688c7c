"""Every command and subcommand answers ``--help``, whatever its group's options would need to run."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from gpuslice.cli import main
from gpuslice.inspect.plugin import main as plugin


def _paths(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = []
    context = click.Context(group)
    for name in group.list_commands(context):
        command = group.get_command(context, name)
        assert command is not None, name
        found.append((*prefix, name))
        if isinstance(command, click.Group):
            found += _paths(command, (*prefix, name))
    return found


@pytest.mark.parametrize(("program", "path"), [*((main, p) for p in _paths(main)), *((plugin, p) for p in _paths(plugin))],
                         ids=lambda v: " ".join(v) if isinstance(v, tuple) else v.name)
def test_help_works(program: click.Group, path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(program, [*path, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output
