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
