"""Settings: one documented object per process, every field a CLI flag and an environment variable.

A process's settings (``controller.settings.ControllerSettings``, ``agent.settings.AgentSettings``)
are a frozen pydantic model: each field has a type, a default and a description that says the
unit and why the default is what it is. The same model gives the command its flags
(``--status-interval``), each flag its environment variable (``GPUSLICE_STATUS_INTERVAL``), and
``docs/configuration.md`` its tables (``gpuslice settings-docs``), so none of them can say something the others do not.
Tests shorten timers through it rather than sleeping.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from pydantic import BaseModel, ConfigDict

ENV_PREFIX = "GPUSLICE_"
KUBECONFIG_HELP = "Kubeconfig to use (default: $KUBECONFIG, then ~/.kube/config, then in-cluster)."
F = TypeVar("F", bound=Callable[..., Any])


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    @classmethod
    def env_name(cls, field: str) -> str:
        return ENV_PREFIX + field.upper()

    @classmethod
    def flag(cls, field: str) -> str:
        return "--" + field.replace("_", "-")


def _base(annotation: Any) -> tuple[Any, bool]:
    """The type of a field without ``| None``, and whether None is allowed."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0], len(args) < len(typing.get_args(annotation))
    return annotation, False


def _click_type(annotation: Any) -> Any:
    base, _ = _base(annotation)
    if typing.get_origin(base) is typing.Literal:
        return click.Choice([str(v) for v in typing.get_args(base)])
    if base is Path:
        return click.Path(path_type=Path)
    return {int: int, float: float, str: str}.get(base, str)


def options(model: type[Settings], *, required: tuple[str, ...] = ()) -> Callable[[F], F]:
    """Click options for every field of ``model``, each with its environment variable."""

    def decorate(command: F) -> F:
        for name, field in reversed(list(model.model_fields.items())):
            env = model.env_name(name)
            default = None if field.is_required() else field.default
            help_text = f"{field.description} [env {env}]"
            base, _ = _base(field.annotation)
            if base is bool:
                flag = model.flag(name)
                command = click.option(f"{flag}/--no-{flag[2:]}", envvar=env, default=default, show_default=True,
                                       help=help_text)(command)
                continue
            command = click.option(model.flag(name), name, envvar=env, type=_click_type(field.annotation),
                                   default=default, show_default=default is not None,
                                   required=name in required, help=help_text)(command)
        return command

    return decorate


def markdown(model: type[Settings]) -> str:
    """The settings as a table for docs/configuration.md."""
    rows = ["| flag | environment | default | what, in which unit, and why |", "|---|---|---|---|"]
    for name, field in model.model_fields.items():
        default = "(required)" if field.is_required() else ("" if field.default is None else f"`{field.default}`")
        words = (field.description or "").replace("|", "\\|")
        rows.append(f"| `{model.flag(name)}` | `{model.env_name(name)}` | {default} | {words} |")
    return "\n".join(rows) + "\n"
