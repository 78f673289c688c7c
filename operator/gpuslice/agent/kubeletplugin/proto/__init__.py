"""The kubelet's gRPC contracts, as gpuslice states them: plugin registration, the DRA
service (v1) and device health (v1). The ``*_pb2*`` modules are generated from the
``.proto`` files next to them by ``make protos`` and committed; a unit test fails
when they are stale."""
