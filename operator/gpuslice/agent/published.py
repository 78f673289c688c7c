"""What the agent last published, kept on the node.

The kubelet deletes a driver's ResourceSlices when its plugin has been away for 30 s,
and all of a node's slices when it starts. An agent that comes back then finds
nothing published, and nothing live to tell it which devices claims still hold in
their old shape (a held, pending change) or how far the pool's generation had got.
So each written pool is also saved here, and a cycle that finds the pool empty
takes this as what was published: allocated devices come back exactly as they were.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from gpuslice.agent.files import write_atomic

log = structlog.get_logger(__name__)
FILE = "published.json"


@dataclass(frozen=True)
class Published:
    generation: int
    devices: list[dict[str, Any]]
    counter_sets: list[dict[str, Any]]


class PublishedRecord:
    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / FILE

    def load(self) -> Published | None:
        try:
            data = json.loads(self.path.read_text())
            return Published(int(data["generation"]), list(data["devices"]), list(data["counterSets"]))
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as error:
            log.error("the record of what was last published does not parse; ignored", path=str(self.path),
                      error=str(error))
            return None

    def save(self, published: Published) -> None:
        write_atomic(self.path, json.dumps({"generation": published.generation, "devices": published.devices,
                                            "counterSets": published.counter_sets}, sort_keys=True))
