"""Decoding of the Kubernetes protobuf wire format for the few kinds that typed clients write here.

kubectl's typed commands (``kubectl create namespace|secret|configmap``) and helm (its release
Secrets) send ``application/vnd.kubernetes.protobuf`` bodies, and client-go never falls back to JSON.
This module turns such a body into the JSON object the server would have decoded, for Namespace,
Secret, ConfigMap and ServiceAccount; other kinds raise ``ProtobufUnsupported`` (answered 415).
Responses stay JSON, which those clients accept.

It knows the field numbers of ``k8s.io/api`` ``generated.proto`` for these kinds and of ObjectMeta;
server-set metadata (uid, resourceVersion, timestamps, managedFields) is skipped, as the server
would overwrite it anyway.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator

from .resources import JSON

__all__ = ["MAGIC", "ProtobufUnsupported", "decode_object"]

MAGIC = b"k8s\x00"


class ProtobufUnsupported(ValueError):
    """The body is protobuf of a kind (or shape) this emulator cannot decode."""


def _varint(data: bytes, position: int) -> tuple[int, int]:
    result, shift = 0, 0
    while True:
        if position >= len(data):
            raise ProtobufUnsupported("truncated varint")
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, position
        shift += 7


def fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) pairs of one message: ints for varints, bytes for length-delimited."""
    position = 0
    while position < len(data):
        key, position = _varint(data, position)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, position = _varint(data, position)
            yield number, value
        elif wire == 2:
            length, position = _varint(data, position)
            yield number, data[position : position + length]
            position += length
        elif wire in (1, 5):  # fixed64 / fixed32: not used by these kinds; skip them
            position += 8 if wire == 1 else 4
        else:
            raise ProtobufUnsupported(f"unsupported wire type {wire}")


def _text(value: int | bytes) -> str:
    if not isinstance(value, bytes):
        raise ProtobufUnsupported("expected a string field")
    return value.decode()


def _entry(value: int | bytes) -> tuple[str, bytes]:
    """A map entry message: key (1) and value (2)."""
    if not isinstance(value, bytes):
        raise ProtobufUnsupported("expected a map entry")
    key, item = "", b""
    for number, part in fields(value):
        if number == 1:
            key = _text(part)
        elif number == 2 and isinstance(part, bytes):
            item = part
    return key, item


def _owner_reference(value: bytes) -> JSON:
    names = {1: "kind", 3: "name", 4: "uid", 5: "apiVersion"}
    ref: JSON = {}
    for number, part in fields(value):
        if number in names:
            ref[names[number]] = _text(part)
        elif number in (6, 7):
            ref["controller" if number == 6 else "blockOwnerDeletion"] = bool(part)
    return ref


def _metadata(value: bytes) -> JSON:
    meta: JSON = {}
    for number, part in fields(value):
        if number in (1, 2, 3):
            meta[{1: "name", 2: "generateName", 3: "namespace"}[number]] = _text(part)
        elif number in (11, 12):
            key, item = _entry(part)
            meta.setdefault("labels" if number == 11 else "annotations", {})[key] = item.decode()
        elif number == 13 and isinstance(part, bytes):
            meta.setdefault("ownerReferences", []).append(_owner_reference(part))
        elif number == 14:
            meta.setdefault("finalizers", []).append(_text(part))
    return meta


def _secret(raw: bytes) -> JSON:
    obj: JSON = {}
    for number, part in fields(raw):
        if number == 1 and isinstance(part, bytes):
            obj["metadata"] = _metadata(part)
        elif number == 2:
            key, item = _entry(part)
            obj.setdefault("data", {})[key] = base64.b64encode(item).decode()
        elif number == 3:
            obj["type"] = _text(part)
        elif number == 4:
            key, item = _entry(part)
            obj.setdefault("data", {})[key] = base64.b64encode(
                item
            ).decode()  # stringData, as the server folds it
        elif number == 5:
            obj["immutable"] = bool(part)
    return obj


def _config_map(raw: bytes) -> JSON:
    obj: JSON = {}
    for number, part in fields(raw):
        if number == 1 and isinstance(part, bytes):
            obj["metadata"] = _metadata(part)
        elif number == 2:
            key, item = _entry(part)
            obj.setdefault("data", {})[key] = item.decode()
        elif number == 3:
            key, item = _entry(part)
            obj.setdefault("binaryData", {})[key] = base64.b64encode(item).decode()
        elif number == 4:
            obj["immutable"] = bool(part)
    return obj


def _namespace(raw: bytes) -> JSON:
    obj: JSON = {}
    for number, part in fields(raw):
        if number == 1 and isinstance(part, bytes):
            obj["metadata"] = _metadata(part)
        elif number == 2 and isinstance(part, bytes):
            finalizers = [_text(p) for n, p in fields(part) if n == 1]
            obj["spec"] = {"finalizers": finalizers} if finalizers else {}
    return obj


def _metadata_only(raw: bytes) -> JSON:
    return {"metadata": next((_metadata(p) for n, p in fields(raw) if n == 1 and isinstance(p, bytes)), {})}


_DECODERS: dict[tuple[str, str], Callable[[bytes], JSON]] = {
    ("v1", "Secret"): _secret,
    ("v1", "ConfigMap"): _config_map,
    ("v1", "Namespace"): _namespace,
    ("v1", "ServiceAccount"): _metadata_only,
}


def decode_object(body: bytes) -> JSON:
    """The JSON form of a protobuf-encoded object (``k8s\\0`` + ``runtime.Unknown``)."""
    if not body.startswith(MAGIC):
        raise ProtobufUnsupported("the body lacks the k8s protobuf magic prefix")
    api_version = kind = ""
    raw = b""
    for number, part in fields(body[len(MAGIC) :]):
        if number == 1 and isinstance(part, bytes):
            for meta_number, meta_part in fields(part):
                if meta_number == 1:
                    api_version = _text(meta_part)
                elif meta_number == 2:
                    kind = _text(meta_part)
        elif number == 2 and isinstance(part, bytes):
            raw = part
    decoder = _DECODERS.get((api_version, kind))
    if decoder is None:
        raise ProtobufUnsupported(f"protobuf bodies of {api_version} {kind} are not supported; send JSON")
    return {"apiVersion": api_version, "kind": kind} | decoder(raw)
