"""What a human output may print of what it read from the cluster.

Names are DNS labels, but Event messages, conditions' messages, annotations and label values are
free text, and a tenant writes some of them: Kubernetes' built-in ``edit`` and ``admin`` roles let
it create Events in its namespace. Printed raw, their escape sequences would reach the terminal of
whoever runs ``gpuslice status``, ``why``, ``plan --cluster`` or ``defrag``: a new window title, a
clipboard write (OSC 52), a cleared screen, hidden text. rich strips only BEL, BS, VT, FF and CR;
ESC passes. And an SVG with a control character in it is no XML: a browser shows nothing.

So every human rendering works on a copy of its model in which every string is :func:`printable`:
C0 and C1 controls (all but newline and tab), DEL, the Unicode controls that reorder or hide text
(bidirectional overrides and isolates, as in "Trojan Source") and code points no encoder writes
(lone surrogates: printing one would crash the command) are shown as ``\\xNN`` or ``\\uNNNN``.
``-o json`` prints the model as read (``json.dumps`` escapes control characters itself).
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")

_UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
                          "\ud800-\udfff\ufffe\uffff]")


def _escaped(found: re.Match[str]) -> str:
    code = ord(found.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` with every character that would act on a terminal, or that XML forbids, shown as its
    escape; newlines and tabs kept."""
    return _UNPRINTABLE.sub(_escaped, text)


def printable_model(value: T) -> T:
    """A copy of ``value`` (dataclasses, mappings, sequences and sets of them) whose strings are all
    :func:`printable`; a string that needs no change is kept as it is (so a ``str`` enum stays one)."""
    return _clean(value)  # type: ignore[no-any-return]


def _clean(value: Any) -> Any:
    if isinstance(value, str):
        cleaned = printable(value)
        return value if cleaned == value else cleaned
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        copied = copy.copy(value)
        for field in dataclasses.fields(value):
            object.__setattr__(copied, field.name, _clean(getattr(value, field.name)))
        return copied
    if isinstance(value, Mapping):
        return {_clean(k): _clean(v) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a NamedTuple
        return type(value)(*(_clean(v) for v in value))
    if isinstance(value, tuple | list | set | frozenset):
        return type(value)(_clean(v) for v in value)
    return value
