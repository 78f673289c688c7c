"""The two shapes of JSON the package passes around, declared once.

``Body`` is an object as read (from the API server, a file, a watch event): read-only, so a
function that only reads cannot change what its caller holds. ``Object`` is one being built to be
written (a manifest, a patch, a schema). Typed readers of particular shapes (``dra.wire``,
``api.resource``) turn either into models; these aliases are for the code that stays on JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Body = Mapping[str, Any]
Object = dict[str, Any]


def objects_in(value: object) -> list[Object]:
    """The entries of a JSON list that are objects, in order, as parsed (the same dicts, not copies);
    [] for anything but a list. A reader of a field that should hold a list of objects takes it
    through here, so null, a missing field or a malformed body reads as nothing rather than
    crashing the reader."""
    return [entry for entry in value if isinstance(entry, dict)] if isinstance(value, list | tuple) else []
