"""Settings: one documented object per process, every field a CLI flag and an environment variable.

A process's settings (``controller.settings.ControllerSettings``, ``agent.settings.AgentSettings``)
are a frozen pydantic model: each field has a type, a default and a description that says the
unit and why the default is what it is. The same model gives the command its flags
(``--status-interval``), each flag its environment variable (``GPUSLICE_STATUS_INTERVAL``), and
``docs/configuration.md`` its lists (``gpuslice settings-docs``), so none of them can say something the others do not.
Tests shorten timers through it rather than sleeping.
"""

from __future__ import annotations

import textwrap
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

import click
import pydantic
from pydantic import BaseModel, ConfigDict, Field

from gpuslice.dra.names import CONTROLLER_NAMESPACE

ENV_PREFIX = "GPUSLICE_"
LogLevel = Literal["debug", "info", "warning", "error"]
LogFormat = Literal["auto", "json", "console"]
KUBECONFIG_HELP = ("Kubeconfig file to use. Without it, kubectl's order: the files $KUBECONFIG lists (merged as"
                   " kubectl merges them), else ~/.kube/config, else the pod's ServiceAccount when run in a pod.")
CONTEXT_HELP = "The kubeconfig context to use (default: its current-context), as kubectl --context."
F = TypeVar("F", bound=Callable[..., Any])


class Settings(BaseModel):
    # No infinite or NaN timers: a debounce of inf would never publish, a backoff of nan never retry.
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    @classmethod
    def env_name(cls, field: str) -> str:
        return ENV_PREFIX + field.upper()

    @classmethod
    def flag(cls, field: str) -> str:
        return "--" + field.replace("_", "-")


class ProcessSettings(Settings):
    """What both long-running processes (controller and agent) are told alike."""

    kubeconfig: Path | None = Field(default=None, description=(
        "Kubeconfig file to use; without one, the pod's ServiceAccount (first: in a pod, a process acts as its own),"
        " then the files $KUBECONFIG lists (merged as kubectl merges them), else ~/.kube/config."))
    metrics_port: int | None = Field(default=None, ge=1, le=65535, description=(
        "Serve Prometheus metrics on this port (/metrics); off when unset."))
    log_level: LogLevel = Field(default="info", description="Least severe log lines written.")
    log_format: LogFormat = Field(default="auto", description=(
        "json: one JSON object a line (what log collectors parse); console: lines for a person; auto: console"
        " on a terminal, JSON otherwise (a container)."))
    request_timeout: float = Field(default=60.0, gt=0, description=(
        "Seconds one API request may take, connection included: a half-open connection must not hang the"
        " work that waits for it."))
    namespace: str | None = Field(default=None, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
                                  description=(
        "gpuslice's own namespace: where its Lease, drain lists, maxMemory ledgers, webhook Service and Secrets"
        " are, and the one namespace that can never be a tenant. The chart and the manifests set it from the"
        " pod's own (the Downward API). Unset: gpuslice-system (the controller: its ServiceAccount's namespace"
        " when it runs as one)."))
    shutdown_grace: float = Field(default=10.0, gt=0, description=(
        "Seconds from SIGTERM to a forced exit: a request to an API server going down with us must not keep"
        " the process alive for minutes."))


    @property
    def home(self) -> str:
        """gpuslice's own namespace as this process was told it, else the default."""
        return self.namespace or CONTROLLER_NAMESPACE


class ClusterAccess(Settings):
    """How ``gpuslice status``, ``why`` and ``plan --cluster`` (and ``kubectl gpuslice``) reach a cluster:
    as kubectl does."""

    kubeconfig: Path | None = Field(default=None, description=KUBECONFIG_HELP)
    context: str | None = Field(default=None, description=CONTEXT_HELP)
    gpuslice_namespace: str = Field(default=CONTROLLER_NAMESPACE, max_length=63,
                                    pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", description=(
        "The namespace gpuslice is installed in (helm install -n), where the agents' drain lists and the"
        " maxMemory ledgers are read from. Not -n/--namespace: that is the namespace of the pods and claims"
        " looked at, as in kubectl."))

    @classmethod
    def env_name(cls, field: str) -> str:
        """GPUSLICE_NAMESPACE, the name the processes read it by, not GPUSLICE_GPUSLICE_NAMESPACE."""
        return "GPUSLICE_NAMESPACE" if field == "gpuslice_namespace" else super().env_name(field)


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


def _envvars(model: type[Settings], name: str) -> list[str]:
    """The field's variable, then the older names it also answers to (``env_aliases``)."""
    extra = model.model_fields[name].json_schema_extra
    aliases = extra.get("env_aliases", []) if isinstance(extra, dict) else []
    return [model.env_name(name), *(str(a) for a in aliases)] if isinstance(aliases, list) else [model.env_name(name)]


S = TypeVar("S", bound=Settings)


def from_flags(model: type[S], values: dict[str, Any]) -> S:
    """The settings from the flags and variables, or a usage error that names the flag and the fix."""
    try:
        return model(**values)
    except pydantic.ValidationError as error:
        raise click.UsageError("; ".join(
            (f"{model.flag(str(e['loc'][0]))}: " if e["loc"] else "") + e["msg"].removeprefix("Value error, ")
            for e in error.errors())) from None


def options(model: type[Settings]) -> Callable[[F], F]:
    """Click options for every field of ``model``, each with its environment variable. A field without a
    default is a required option; a ``tuple[X, ...]`` field is a repeatable one."""

    def decorate(command: F) -> F:
        for name, field in reversed(list(model.model_fields.items())):
            envvars = _envvars(model, name)
            default = None if field.is_required() else field.default
            help_text = f"{field.description} [env {' or '.join(envvars)}]"
            base, _ = _base(field.annotation)
            if base is bool:
                flag = model.flag(name)
                command = click.option(f"{flag}/--no-{flag[2:]}", envvar=envvars, default=default, show_default=True,
                                       help=help_text)(command)
                continue
            repeated = typing.get_origin(base) is tuple
            kind = _click_type(typing.get_args(base)[0] if repeated else field.annotation)
            # click 8.3+ takes an explicit default=None as a value: a required option gets none.
            given = {"required": True} if field.is_required() else {"default": default}
            command = click.option(model.flag(name), name, envvar=envvars, type=kind, multiple=repeated,
                                   show_default=default not in (None, ()), help=help_text, **given)(command)
        return command

    return decorate


def markdown(model: type[Settings]) -> str:
    """The settings as a list for docs/configuration.md: one item a setting, wrapped, because a table's row
    cannot be, and some descriptions are a paragraph long."""
    items = []
    for name, field in model.model_fields.items():
        default = ("required" if field.is_required() else
                   "" if field.default in (None, ()) else f"default `{field.default!s}`" if field.default != ""
                   else 'default `""`')
        said = ", ".join([*(f"`{e}`" for e in _envvars(model, name)), *([default] if default else [])])
        item = f"- `{model.flag(name)}` ({said}): {' '.join((field.description or '').split())}"
        items.extend(textwrap.wrap(item, 110, subsequent_indent="  ", break_long_words=False,
                                   break_on_hyphens=False))
    return "\n".join(items) + "\n"
