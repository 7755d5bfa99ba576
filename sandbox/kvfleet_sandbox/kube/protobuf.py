"""A minimal decoder for the Kubernetes protobuf encoding of the few kinds helm and kubectl send that way.

Called from ``routing`` when a request body has ``Content-Type: application/vnd.kubernetes.protobuf``. Helm's
release storage uses client-go's typed Secret client, which writes protobuf, and so do kubectl's ``create``
generators (both accept JSON answers, so only request bodies need decoding). The wire format is the
``k8s\\x00`` magic followed by a ``runtime.Unknown`` envelope (typeMeta, raw); field numbers come from
k8s.io/api's ``generated.proto`` files. Other kinds are refused with 415 and a hint to send JSON.
"""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Iterator
from typing import Any

from kvfleet_sandbox.kube.errors import ApiError

MAGIC = b"k8s\x00"


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def fields(buf: bytes) -> Iterator[tuple[int, Any]]:
    """(field number, value) pairs: varints as int, length-delimited as bytes; fixed widths skipped."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 2:
            length, pos = _varint(buf, pos)
            value, pos = buf[pos:pos + length], pos + length
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            raise ApiError(400, "BadRequest", f"unsupported protobuf wire type {wire}")
        yield number, value


def _map_entry(buf: bytes) -> tuple[str, bytes]:
    key, value = "", b""
    for n, v in fields(buf):
        if n == 1:
            key = v.decode()
        elif n == 2:
            value = v
    return key, value


def _time(buf: bytes) -> str:
    seconds = next((v for n, v in fields(buf) if n == 1), 0)
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


_META_STRINGS = {1: "name", 2: "generateName", 3: "namespace", 5: "uid", 6: "resourceVersion"}


def _object_meta(buf: bytes) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    for n, v in fields(buf):
        if n in _META_STRINGS:
            meta[_META_STRINGS[n]] = v.decode()
        elif n == 7:
            meta["generation"] = v
        elif n == 8:
            meta["creationTimestamp"] = _time(v)
        elif n in (11, 12):
            k, val = _map_entry(v)
            meta.setdefault("labels" if n == 11 else "annotations", {})[k] = val.decode()
        elif n == 14:
            meta.setdefault("finalizers", []).append(v.decode())
    return meta


def _secret(buf: bytes) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for n, v in fields(buf):
        if n == 1:
            obj["metadata"] = _object_meta(v)
        elif n == 2:
            k, val = _map_entry(v)
            obj.setdefault("data", {})[k] = base64.b64encode(val).decode()
        elif n == 3:
            obj["type"] = v.decode()
        elif n == 4:
            k, val = _map_entry(v)
            obj.setdefault("stringData", {})[k] = val.decode()
        elif n == 5:
            obj["immutable"] = bool(v)
    return obj


def _configmap(buf: bytes) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for n, v in fields(buf):
        if n == 1:
            obj["metadata"] = _object_meta(v)
        elif n == 2:
            k, val = _map_entry(v)
            obj.setdefault("data", {})[k] = val.decode()
        elif n == 3:
            k, val = _map_entry(v)
            obj.setdefault("binaryData", {})[k] = base64.b64encode(val).decode()
        elif n == 4:
            obj["immutable"] = bool(v)
    return obj


def _namespace(buf: bytes) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for n, v in fields(buf):
        if n == 1:
            obj["metadata"] = _object_meta(v)
        elif n == 2:
            finalizers = [fv.decode() for fn, fv in fields(v) if fn == 1]
            obj["spec"] = {"finalizers": finalizers} if finalizers else {}
    return obj


# Secret and ConfigMap: helm's release storage (and kubectl create secret/configmap); Namespace: kubectl create ns.
_DECODERS = {("v1", "Secret"): _secret, ("v1", "ConfigMap"): _configmap, ("v1", "Namespace"): _namespace}


def decode(body: bytes) -> dict[str, Any]:
    if not body.startswith(MAGIC):
        raise ApiError(400, "BadRequest", "protobuf body without the k8s magic prefix")
    api_version = kind = ""
    raw = b""
    for n, v in fields(body[len(MAGIC):]):
        if n == 1:
            for tn, tv in fields(v):
                if tn == 1:
                    api_version = tv.decode()
                elif tn == 2:
                    kind = tv.decode()
        elif n == 2:
            raw = v
    decoder = _DECODERS.get((api_version, kind))
    if decoder is None:
        raise ApiError(415, "UnsupportedMediaType",
                       f"the sandbox decodes protobuf only for {sorted(k for _, k in _DECODERS)}, not {kind}; "
                       "send JSON (e.g. kubectl apply -f) instead")
    return {"apiVersion": api_version, "kind": kind, **decoder(raw)}
