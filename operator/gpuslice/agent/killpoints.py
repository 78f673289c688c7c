"""Test-only kill points: ``GPUSLICE_TEST_KILL_AT=<point>`` makes the agent SIGKILL itself there.

A process cannot be made to die between two particular statements from outside,
so the crash-safety tests name the worst moments and the agent dies at them:

- ``prepare-started``: the ``started`` checkpoint is written, nothing is made yet;
- ``prepare-mig-created``: a dynamic MIG instance exists, no checkpoint says it is done;
- ``prepare-mps-started``: the GPU's MPS control daemon runs, no checkpoint says the claim is done;
- ``prepare-cdi-written``: the CDI spec is written, the checkpoint still says ``started``;
- ``unprepare-mig-destroyed``: the instance is gone, the checkpoint still says ``completed``.

Unset (always, outside tests) it costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal

ENV = "GPUSLICE_TEST_KILL_AT"
POINTS = frozenset({"prepare-started", "prepare-mig-created", "prepare-mps-started", "prepare-cdi-written",
                    "unprepare-mig-destroyed"})


def kill_point(name: str) -> None:
    assert name in POINTS, name
    if os.environ.get(ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
