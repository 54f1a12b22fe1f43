"""A fake kubelet: a real gRPC server on a unix socket answering
`v1.PodResourcesLister/List` with messages the protobuf library encodes (from a descriptor
built here after k8s.io/kubelet/pkg/apis/podresources/v1/api.proto, fields the exporter
ignores included, and devices allocated through DRA in `dynamic_resources`), so the
exporter's hand-written decoder is tested against protobuf's own encoding."""

from __future__ import annotations

import os
from concurrent import futures
from dataclasses import dataclass

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_STRING, _MESSAGE, _INT64, _UINT64 = 9, 11, 3, 4
_ONE, _MANY = 1, 3


def _message_classes() -> dict:
    proto = descriptor_pb2.FileDescriptorProto(name="cte_test_podresources.proto",
                                               package="v1", syntax="proto3")

    def message(name: str, *fields: tuple[str, int, int, int, str]) -> None:
        m = proto.message_type.add(name=name)
        for field_name, number, kind, label, type_name in fields:
            f = m.field.add(name=field_name, number=number, type=kind, label=label)
            if type_name:
                f.type_name = f".v1.{type_name}"

    message("NUMANode", ("ID", 1, _INT64, _ONE, ""))
    message("TopologyInfo", ("nodes", 1, _MESSAGE, _MANY, "NUMANode"))
    message("ContainerDevices", ("resource_name", 1, _STRING, _ONE, ""),
            ("device_ids", 2, _STRING, _MANY, ""), ("topology", 3, _MESSAGE, _ONE, "TopologyInfo"))
    message("ContainerMemory", ("memory_type", 1, _STRING, _ONE, ""),
            ("size", 2, _UINT64, _ONE, ""), ("topology", 3, _MESSAGE, _ONE, "TopologyInfo"))
    message("CDIDevice", ("name", 1, _STRING, _ONE, ""))
    message("ClaimResource", ("cdi_devices", 1, _MESSAGE, _MANY, "CDIDevice"),
            ("driver_name", 2, _STRING, _ONE, ""), ("pool_name", 3, _STRING, _ONE, ""),
            ("device_name", 4, _STRING, _ONE, ""))
    message("DynamicResource", ("claim_name", 2, _STRING, _ONE, ""),
            ("claim_namespace", 3, _STRING, _ONE, ""),
            ("claim_resources", 4, _MESSAGE, _MANY, "ClaimResource"))
    message("ContainerResources", ("name", 1, _STRING, _ONE, ""),
            ("devices", 2, _MESSAGE, _MANY, "ContainerDevices"),
            ("cpu_ids", 3, _INT64, _MANY, ""),
            ("memory", 4, _MESSAGE, _MANY, "ContainerMemory"),
            ("dynamic_resources", 5, _MESSAGE, _MANY, "DynamicResource"))
    message("PodResources", ("name", 1, _STRING, _ONE, ""), ("namespace", 2, _STRING, _ONE, ""),
            ("containers", 3, _MESSAGE, _MANY, "ContainerResources"))
    message("ListPodResourcesResponse",
            ("pod_resources", 1, _MESSAGE, _MANY, "PodResources"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"v1.{name}"))
            for name in ("ListPodResourcesResponse",)}


MESSAGES = _message_classes()


@dataclass(frozen=True)
class Holding:
    namespace: str
    pod: str
    container: str
    resource: str  # with dra: the DRA driver's name
    device_ids: tuple[str, ...]  # with dra: the devices' names in the driver's pool
    dra: bool = False  # allocated through a ResourceClaim (dynamic_resources)


def encode(holdings: list[Holding]) -> bytes:
    """A ListPodResourcesResponse, one container per holding (a pod's containers kept
    together), with CPU ids, memory and topology as a real kubelet sends them."""
    response = MESSAGES["ListPodResourcesResponse"]()
    pods: dict[tuple[str, str], object] = {}
    for h in holdings:
        pod = pods.get((h.namespace, h.pod))
        if pod is None:
            pod = pods[(h.namespace, h.pod)] = response.pod_resources.add(
                name=h.pod, namespace=h.namespace)
        container = pod.containers.add(name=h.container)
        container.cpu_ids.extend([2, 3, 66, 67])
        container.memory.add(memory_type="memory", size=2**34).topology.nodes.add(ID=0)
        if h.dra:  # one claim, one ClaimResource per device, with its CDI name
            claim = container.dynamic_resources.add(claim_name=f"{h.pod}-gpus",
                                                    claim_namespace=h.namespace)
            for name in h.device_ids:
                resource = claim.claim_resources.add(driver_name=h.resource,
                                                     pool_name="node-7", device_name=name)
                resource.cdi_devices.add(name=f"k8s.{h.resource}/claim=c0ffee-{name}")
            continue
        devices = container.devices.add(resource_name=h.resource)
        devices.device_ids.extend(h.device_ids)
        devices.topology.nodes.add(ID=1)
    return response.SerializeToString()


class FakeKubelet:
    """Serves List on `path` (start, stop and restart it like a kubelet)."""

    def __init__(self, path: str, holdings: list[Holding] | None = None) -> None:
        self.path = path
        self.holdings = list(holdings or [])
        self.raw: bytes | None = None  # set: answer these bytes instead
        self.calls = 0
        self.server: grpc.Server | None = None

    def _list(self, request: bytes, context) -> bytes:
        self.calls += 1
        return self.raw if self.raw is not None else encode(self.holdings)

    def start(self) -> FakeKubelet:
        assert len(self.path) < 100, "unix socket paths are limited to 107 bytes"
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        handler = grpc.method_handlers_generic_handler("v1.PodResourcesLister", {
            "List": grpc.unary_unary_rpc_method_handler(self._list)})
        server.add_generic_rpc_handlers((handler,))
        server.add_insecure_port(f"unix:{self.path}")
        server.start()
        self.server = server
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(None).wait(5)
            self.server = None
        if os.path.exists(self.path):
            os.unlink(self.path)
