"""The kubelet plugin's gRPC code: fresh from its .proto files, and on the kubelet's wire contract.

The wire contract is transcribed from k8s.io/kubelet v0.37.2 (pkg/apis/dra/v1,
pkg/apis/pluginregistration/v1, pkg/apis/dra-health/v1, pkg/apis/podresources/v1): what goes on the wire is the
package-qualified service and method names, and each field's number, type and label.
The cluster tests then speak it with the kubelet's own code.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from gpuslice.agent.kubeletplugin.proto import (
    dra_pb2,
    drahealth_pb2,
    generate,
    pluginregistration_pb2,
    podresources_pb2,
)


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    written = generate.generate(tmp_path)
    assert written, "the generator wrote nothing"
    for fresh in written:
        committed = generate.SOURCE_ROOT / fresh.relative_to(tmp_path)
        assert committed.is_file(), f"{committed} is missing: run `make protos` and commit the result"
        assert committed.read_bytes() == fresh.read_bytes(), (
            f"{committed.relative_to(generate.SOURCE_ROOT.parent)} is stale: run `make protos` and commit the result")


T = FieldDescriptor
STRING, BOOL, INT64, UINT64, MESSAGE, ENUM = (T.TYPE_STRING, T.TYPE_BOOL, T.TYPE_INT64, T.TYPE_UINT64,
                                              T.TYPE_MESSAGE, T.TYPE_ENUM)
# message -> {field: (number, type, repeated)}
WIRE: dict[str, dict[str, tuple[int, int, bool]]] = {
    "k8s.io.kubelet.pkg.apis.dra.v1.Claim": {"namespace": (1, STRING, False), "uid": (2, STRING, False),
                                             "name": (3, STRING, False)},
    "k8s.io.kubelet.pkg.apis.dra.v1.NodePrepareResourcesRequest": {"claims": (1, MESSAGE, True)},
    "k8s.io.kubelet.pkg.apis.dra.v1.NodePrepareResourcesResponse": {"claims": (1, MESSAGE, True)},  # a map
    "k8s.io.kubelet.pkg.apis.dra.v1.NodePrepareResourceResponse": {"devices": (1, MESSAGE, True),
                                                                   "error": (2, STRING, False)},
    "k8s.io.kubelet.pkg.apis.dra.v1.Device": {
        "request_names": (1, STRING, True), "pool_name": (2, STRING, False), "device_name": (3, STRING, False),
        "cdi_device_ids": (4, STRING, True), "share_id": (5, STRING, False)},
    "k8s.io.kubelet.pkg.apis.dra.v1.NodeUnprepareResourcesRequest": {"claims": (1, MESSAGE, True)},
    "k8s.io.kubelet.pkg.apis.dra.v1.NodeUnprepareResourcesResponse": {"claims": (1, MESSAGE, True)},
    "k8s.io.kubelet.pkg.apis.dra.v1.NodeUnprepareResourceResponse": {"error": (1, STRING, False)},
    "pluginregistration.PluginInfo": {"type": (1, STRING, False), "name": (2, STRING, False),
                                      "endpoint": (3, STRING, False), "supported_versions": (4, STRING, True)},
    "pluginregistration.RegistrationStatus": {"plugin_registered": (1, BOOL, False), "error": (2, STRING, False)},
    "pluginregistration.RegistrationStatusResponse": {},
    "pluginregistration.InfoRequest": {},
    "v1.NodeWatchResourcesRequest": {},
    "v1.DeviceIdentifier": {"pool_name": (1, STRING, False), "device_name": (2, STRING, False)},
    "v1.DeviceHealth": {"device": (1, MESSAGE, False), "health": (2, ENUM, False), "last_updated_time": (3, INT64, False),
                        "health_check_timeout_seconds": (4, INT64, False), "message": (5, STRING, False)},
    "v1.NodeWatchResourcesResponse": {"devices": (1, MESSAGE, True)},
    # pkg/apis/podresources/v1/api.proto
    "v1.AllocatableResourcesRequest": {},
    "v1.AllocatableResourcesResponse": {"devices": (1, MESSAGE, True), "cpu_ids": (2, INT64, True),
                                        "memory": (3, MESSAGE, True)},
    "v1.ListPodResourcesRequest": {},
    "v1.ListPodResourcesResponse": {"pod_resources": (1, MESSAGE, True)},
    "v1.PodResources": {"name": (1, STRING, False), "namespace": (2, STRING, False), "containers": (3, MESSAGE, True),
                        "cpu_ids": (4, INT64, True), "memory": (5, MESSAGE, True)},
    "v1.ContainerResources": {"name": (1, STRING, False), "devices": (2, MESSAGE, True), "cpu_ids": (3, INT64, True),
                              "memory": (4, MESSAGE, True), "dynamic_resources": (5, MESSAGE, True)},
    "v1.ContainerMemory": {"memory_type": (1, STRING, False), "size": (2, UINT64, False),
                           "topology": (3, MESSAGE, False)},
    "v1.ContainerDevices": {"resource_name": (1, STRING, False), "device_ids": (2, STRING, True),
                            "topology": (3, MESSAGE, False)},
    "v1.TopologyInfo": {"nodes": (1, MESSAGE, True)},
    "v1.NUMANode": {"ID": (1, INT64, False)},
    "v1.DynamicResource": {"claim_name": (2, STRING, False), "claim_namespace": (3, STRING, False),
                           "claim_resources": (4, MESSAGE, True)},
    "v1.ClaimResource": {"cdi_devices": (1, MESSAGE, True), "driver_name": (2, STRING, False),
                         "pool_name": (3, STRING, False), "device_name": (4, STRING, False),
                         "share_id": (5, STRING, False)},
    "v1.CDIDevice": {"name": (1, STRING, False)},
    "v1.GetPodResourcesRequest": {"pod_name": (1, STRING, False), "pod_namespace": (2, STRING, False)},
    "v1.GetPodResourcesResponse": {"pod_resources": (1, MESSAGE, False)},
}
SERVICES = {
    "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin": {"NodePrepareResources": False, "NodeUnprepareResources": False},
    "pluginregistration.Registration": {"GetInfo": False, "NotifyRegistrationStatus": False},
    "v1.DRAResourceHealth": {"NodeWatchResources": True},  # server streaming
    "v1.PodResourcesLister": {"List": False, "GetAllocatableResources": False, "Get": False},
}
FILES = (dra_pb2.DESCRIPTOR, pluginregistration_pb2.DESCRIPTOR, drahealth_pb2.DESCRIPTOR, podresources_pb2.DESCRIPTOR)


def _messages() -> dict[str, Descriptor]:
    return {m.full_name: m for f in FILES for m in f.message_types_by_name.values()}


@pytest.mark.parametrize("message", sorted(WIRE))
def test_messages_match_the_kubelets_wire_contract(message: str) -> None:
    descriptor = _messages()[message]
    fields = {f.name: (f.number, f.type, f.is_repeated) for f in descriptor.fields}
    assert fields == WIRE[message]


def test_services_and_enums_match_the_kubelets_wire_contract() -> None:
    found = {s.full_name: {m.name: m.server_streaming for m in s.methods}  # type: ignore[attr-defined]
             for f in FILES for s in f.services_by_name.values()}
    assert found == SERVICES
    assert set(_messages()) == set(WIRE)
    assert dict(drahealth_pb2.HealthStatus.items()) == {"UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}
    assert dra_pb2.Device.DESCRIPTOR.fields_by_name["share_id"].has_presence, "share_id is optional on the wire"
    assert podresources_pb2.ClaimResource.DESCRIPTOR.fields_by_name["share_id"].has_presence
