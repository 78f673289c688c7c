"""The one reader of a ResourceSlice's ``spec``: its devices, counter sets, node and pool (pure).

Every module that looks at a published slice (the agent deciding what to rewrite, the controller's
reads, the webhook's mirror, the probe of what the server drops, the bench) reads these four
fields here, so a missing, null or malformed one means the same everywhere: no devices, no
counter sets, no node, no pool. The API server stores no malformed slice; a body from elsewhere (a
test, a file, a server whose schema is not ours) must still read as empty, never crash a reader.
Which generation of a pool counts is ``dra.wire``'s (``pool_mark``, ``newest_generations``).
"""

from __future__ import annotations

from collections.abc import Mapping

from gpuslice.jsontypes import Body, Object, objects_in


def slice_devices(spec: Body) -> list[Object]:
    """The devices a slice publishes (``spec.devices``), as written, in order."""
    return objects_in(spec.get("devices"))


def slice_counter_sets(spec: Body) -> list[Object]:
    """The counter sets a slice declares (``spec.sharedCounters``), as written, in order."""
    return objects_in(spec.get("sharedCounters"))


def slice_node(spec: Body) -> str | None:
    """The node a slice is of (``spec.nodeName``); None for a slice of no one node."""
    node = spec.get("nodeName")
    return None if node is None else str(node)


def slice_pool(spec: Body) -> str | None:
    """The name of a slice's pool (``spec.pool.name``); None when it names none."""
    pool = spec.get("pool")
    name = pool.get("name") if isinstance(pool, Mapping) else None
    return None if name is None else str(name)
