"""The root of gpuslice's own errors, apart from the API server's (``kube.client.KubeError``).

A caller that wants "anything gpuslice itself refused or could not do" catches ``GpusliceError``;
one that wants "the API failed" catches ``KubeError``; neither catches the other by accident.
Control flow that unwinds a process on purpose (a stop signal) is not an error and is not here.
"""

from __future__ import annotations


class GpusliceError(Exception):
    """Something gpuslice found wrong or could not do; the message names the object, the field and the fix."""
