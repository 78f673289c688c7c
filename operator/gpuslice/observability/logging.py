"""Logs: JSON lines in a container, readable lines on a terminal, the objects they are about as fields.

Our own code logs through structlog with the object as fields (``policy=``, ``node=``,
``gpu=``, ``claim=``, ``tenant=``); Kopf and the other libraries log through the standard
``logging`` module, and their lines go through the same formatter. Kopf's per-object lines
carry the object in ``record.k8s_ref``: it becomes the ``object`` field, and the policy or node
field as our own lines would name it, so one query finds every line about a policy.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

from gpuslice.settings import LogFormat

LEVELS = ("debug", "info", "warning", "error")
# Kopf's kinds -> the field our own log lines use for the same object.
_FIELDS = {"GpuSlicePolicy": "policy", "Node": "node", "ResourceClaim": "claim", "Namespace": "tenant"}


def kopf_object(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """A Kopf line about an object gets it as fields (``object``, and ``policy`` or ``node``...)."""
    record = event.get("_record")
    ref = getattr(record, "k8s_ref", None)
    if isinstance(ref, dict) and ref.get("name"):
        kind, name, namespace = ref.get("kind"), ref.get("name"), ref.get("namespace")
        event.setdefault("object", {k: ref[k] for k in ("kind", "namespace", "name") if ref.get(k)})
        field = _FIELDS.get(str(kind))
        if field:
            event.setdefault(field, f"{namespace}/{name}" if field == "claim" and namespace else name)
    return event


_SHARED: list[structlog.types.Processor] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
]


def _tracebacks() -> structlog.typing.ExceptionRenderer:
    """rich's tracebacks when rich is there, but without each frame's local variables, which
    structlog's default shows: a request's Authorization header, an exec plugin's environment, in a
    traceback a person pastes into an issue. Never better-exceptions' either, which prints values."""
    if importlib.util.find_spec("rich") is not None:
        return structlog.dev.RichTracebackFormatter(show_locals=False)
    return structlog.dev.plain_traceback


def configure_logging(level: str = "info", fmt: LogFormat = "auto") -> None:
    """``fmt="auto"``: console lines when stderr is a terminal, JSON lines otherwise (a container)."""
    console = fmt == "console" or (fmt == "auto" and sys.stderr.isatty())
    renderer: structlog.types.Processor = (
        structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty(), exception_formatter=_tracebacks())
        if console else structlog.processors.JSONRenderer())
    structlog.configure(
        processors=[*_SHARED, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*_SHARED, kopf_object],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    *([] if console else [structlog.processors.format_exc_info]), renderer],
    ))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    number = getattr(logging, level.upper(), None)
    if not isinstance(number, int):
        raise ValueError(f"log level {level!r}: use one of {', '.join(LEVELS)}")
    root.setLevel(number)
    # Kopf logs every handler success at INFO; keep its per-object chatter to what matters, unless
    # debugging.
    logging.getLogger("kopf.objects").setLevel(logging.DEBUG if number <= logging.DEBUG else logging.WARNING)
