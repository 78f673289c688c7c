"""The root of gpuslice's own errors, apart from the API server's (``kube.client.KubeError``).

A caller that wants "anything gpuslice itself refused or could not do" catches ``GpusliceError``;
one that wants "the API failed" catches ``KubeError``; neither catches the other by accident.
Control flow that unwinds a process on purpose (a stop signal) is not an error and is not here.

The tree (``tests/unit/test_errors.py`` holds it to the code: every exception class of the
package is under one of the two roots, or named below as internal)::

    Exception
    ├── GpusliceError                    gpuslice refused or could not do something
    │   ├── AgentStopped                 agent.startup: the agent cannot run here (exit 1)
    │   ├── ControllerStopped            controller.run: the controller cannot act (exit 1)
    │   ├── ConvergeFailed               controller.reconcile: a policy's objects not in place
    │   ├── PluginError                  agent.kubeletplugin.errors: prepare/unprepare refused
    │   │   └── ClaimNotFound, NotAllocated, DeviceNotPublished, DeviceUnusable,
    │   │       DeviceHeld, UnprepareFailed, NotATenant
    │   ├── PluginPathError, CheckpointTooNew, PodResourcesError, GpuBackendError, MpsError
    │   ├── UnknownDevice, NvidiaCdiError, ClientCaError, TaskEnded, PciAddressError
    │   ├── KubeconfigError              kube.credentials: no credentials could be loaded
    │   ├── WriteRefused                 agent.check: the read-only check tried a write to the GPU
    │   ├── PlanError, InspectError, DemoFailed, PoliciesRemain, DevClusterError
    │   └── BenchError, BenchPartial     the bench could not measure (part of) a figure
    └── KubeError                        kube.client: a request failed (``status``: HTTP, 0 none)
        ├── BadRequest, Unauthorized, Invalid, TooManyRequests, ServerError, Unreachable
        ├── Forbidden
        │   └── NotReady                 the API server is starting
        ├── NotFound
        ├── Conflict                     a write lost a race
        │   └── AlreadyExists
        ├── Gone                         410: a watch's or list's version is too old: list again
        ├── NotLeader                    controller.leader: a write refused, this copy does not lead
        └── GenerationRefused            agent.dryrun: the API server refused a generation's dry run

``NotLeader`` and ``GenerationRefused`` are gpuslice's own refusals of a request, under
``KubeError`` on purpose: every caller's handling of a failed request (retry, backoff, keep
what was published) is what they need. Internal, never seen outside their module:
``kube.transport.ApiError`` (turned into a ``KubeError`` by the client) and
``kube.tls._PassPhrase``. Status codes are compared in ``kube/`` only: elsewhere, catch the class.
"""

from __future__ import annotations


class GpusliceError(Exception):
    """Something gpuslice found wrong or could not do; the message names the object, the field and the fix."""
