"""Words taken from the code (docstrings, help, schema descriptions) as Markdown that says the same thing.

Outside code spans a ``<name>`` would be an HTML tag to a Markdown renderer, and vanish, and
``__init__`` would be bold; reST's double backticks become Markdown's single ones. Lines are
wrapped, so no generated line is long.
"""

from __future__ import annotations

import re
import textwrap

WIDTH = 110
CODE = re.compile(r"(`[^`]*`)")
ESCAPES = {"<": "&lt;", ">": "&gt;", "__": r"\_\_"}


def prose(text: str) -> str:
    """One paragraph of Markdown from ``text``: whitespace collapsed; outside code, ``<`` and ``>`` escaped,
    and ``__`` (``__init__`` is a name, not bold)."""
    words = " ".join(text.split()).replace("``", "`")
    parts = CODE.split(words)
    for i in range(0, len(parts), 2):  # the even parts are outside code spans
        for raw, escaped in ESCAPES.items():
            parts[i] = parts[i].replace(raw, escaped)
    return "".join(parts)


def wrap(text: str, indent: str = "", then: str | None = None) -> list[str]:
    """``text`` (Markdown already) in lines of at most WIDTH, never broken inside a word."""
    return textwrap.wrap(text, WIDTH, initial_indent=indent,
                         subsequent_indent=" " * len(indent) if then is None else then,
                         break_long_words=False, break_on_hyphens=False)


def first_paragraph(docstring: str | None) -> str:
    return prose(docstring.strip().split("\n\n", 1)[0]) if docstring else ""
