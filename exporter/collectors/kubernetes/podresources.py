"""The kubelet's pod-resources answer, decoded from protobuf's wire format by hand.

`v1.PodResourcesLister/List` (k8s.io/kubelet/pkg/apis/podresources/v1/api.proto) answers
a `ListPodResourcesResponse`; of it we need these fields:

    ListPodResourcesResponse { repeated PodResources pod_resources = 1; }
    PodResources       { string name = 1; string namespace = 2;
                         repeated ContainerResources containers = 3; }
    ContainerResources { string name = 1; repeated ContainerDevices devices = 2; ...
                         repeated DynamicResource dynamic_resources = 5; }
    ContainerDevices   { string resource_name = 1; repeated string device_ids = 2; ... }
    DynamicResource    { ... repeated ClaimResource claim_resources = 4; }
    ClaimResource      { ... string driver_name = 2; ... string device_name = 4; }

Devices from device plugins come in `devices`; devices allocated through dynamic resource
allocation (DRA: a ResourceClaim, Kubernetes 1.31+ with the kubelet's
KubeletPodResourcesDynamicResources gate) come in `dynamic_resources` (Go's
`GetDynamicResources()`), named by driver and device (NVIDIA's DRA driver: `gpu.nvidia.com`,
`gpu-0`). Both become :class:`ContainerDevices`; a DRA one has `dynamic` set, the driver's
name as its resource and the device's name as its one id.

Why by hand rather than generated classes: these are a few messages of strings, the
decoder is under a hundred lines with no dependency (the `kubernetes` extra is only
grpcio), every other field (CPU ids, memory, topology, CDI names, fields a newer kubelet adds) is
skipped by its wire type as protobuf itself would, and garbage is refused with one
:class:`BadMessage` rather than whatever a generated parser's version raises. Its tests
check it against messages the protobuf library encodes.

Bounds: the message is at most what the gRPC channel accepts (16 MiB); nesting is fixed
(five levels at most); a string that is not UTF-8, a truncated field, a wire type protobuf does
not use (groups, 6, 7), or a field number 0 makes the whole answer :class:`BadMessage`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["BadMessage", "ContainerDevices", "parse_list_response"]

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5


class BadMessage(ValueError):
    """Bytes that are not a ListPodResourcesResponse."""


@dataclass(frozen=True)
class ContainerDevices:
    namespace: str
    pod: str
    container: str
    resource_name: str  # a DRA device's: its driver's name
    device_ids: tuple[str, ...]
    dynamic: bool = False  # allocated through DRA (a ResourceClaim), not a device plugin


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    for _ in range(10):
        if pos >= len(buf):
            raise BadMessage("truncated varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    raise BadMessage("varint longer than 10 bytes")


def _fields(buf: memoryview) -> Iterator[tuple[int, memoryview | None]]:
    """(field number, the bytes of a length-delimited field, else None) in order."""
    pos, end = 0, len(buf)
    while pos < end:
        key = buf[pos]
        if key < 0x80:  # the common case: a one-byte key (field numbers below 16)
            pos += 1
        else:
            key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise BadMessage("field number 0")
        if wire == _VARINT:
            _, pos = _varint(buf, pos)
            yield number, None
        elif wire in (_I64, _I32):
            pos += 8 if wire == _I64 else 4
            if pos > end:
                raise BadMessage("truncated fixed-size field")
            yield number, None
        elif wire == _LEN:
            if pos < end and buf[pos] < 0x80:
                length, pos = buf[pos], pos + 1
            else:
                length, pos = _varint(buf, pos)
            if pos + length > end:
                raise BadMessage("truncated length-delimited field")
            yield number, buf[pos:pos + length]
            pos += length
        else:
            raise BadMessage(f"wire type {wire}")


def _string(value: memoryview | None) -> str:
    if value is None:
        raise BadMessage("a string field with a numeric wire type")
    try:
        return bytes(value).decode("utf-8")
    except UnicodeDecodeError:
        raise BadMessage("a string that is not UTF-8") from None


def _devices(buf: memoryview) -> tuple[str, tuple[str, ...]]:
    resource, ids = "", []
    for number, value in _fields(buf):
        if number == 1:
            resource = _string(value)
        elif number == 2:
            ids.append(_string(value))
    return resource, tuple(ids)


def _message(value: memoryview | None, what: str) -> memoryview:
    if value is None:
        raise BadMessage(f"{what} with a numeric wire type")
    return value


def _claim_devices(buf: memoryview) -> Iterator[tuple[str, tuple[str, ...], bool]]:
    """(driver, (device,), True) for each ClaimResource of a DynamicResource."""
    for number, value in _fields(buf):
        if number == 4:
            driver = device = ""
            for inner, text in _fields(_message(value, "claim_resources")):
                if inner == 2:
                    driver = _string(text)
                elif inner == 4:
                    device = _string(text)
            yield driver, (device,), True


def _container(buf: memoryview) -> tuple[str, list[tuple[str, tuple[str, ...], bool]]]:
    name, devices = "", []
    for number, value in _fields(buf):
        if number == 1:
            name = _string(value)
        elif number == 2:
            devices.append((*_devices(_message(value, "devices")), False))
        elif number == 5:
            devices += _claim_devices(_message(value, "dynamic_resources"))
    return name, devices


def _pod(buf: memoryview) -> list[ContainerDevices]:
    name = namespace = ""
    containers = []
    for number, value in _fields(buf):
        if number in (1, 2):
            text = _string(value)
            name, namespace = (text, namespace) if number == 1 else (name, text)
        elif number == 3:
            if value is None:
                raise BadMessage("containers with a numeric wire type")
            containers.append(_container(value))
    return [ContainerDevices(namespace, name, container, resource, ids, dynamic)
            for container, devices in containers for resource, ids, dynamic in devices]


def parse_list_response(raw: bytes, only: bytes = b"") -> list[ContainerDevices]:
    """Every (pod, container, resource) with its device ids, in the kubelet's order.

    With `only` (bytes every wanted pod holds, such as ``b"nvidia.com"``: in a device
    plugin's resource name and a DRA driver's name), a pod whose bytes do not contain it
    is skipped undecoded: most pods of a node hold no GPU, and decoding
    in Python costs ~20 us a pod."""
    out: list[ContainerDevices] = []
    for number, value in _fields(memoryview(raw)):
        if number == 1:
            if value is None:
                raise BadMessage("pod_resources with a numeric wire type")
            if only and only not in value.tobytes():
                continue
            out += _pod(value)
    return out
