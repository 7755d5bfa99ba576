"""The AWS wire protocols the sandbox's AWS emulator speaks, driven by botocore's own service models.

Called from :mod:`kvfleet_sandbox.aws` for every HTTP request: it names the service from the SigV4 credential
scope, decodes the request into ``(operation, params)`` and encodes the result or an :class:`AwsError` back.

Why it exists: the emulator's contract is the model botocore ships (``session.get_service_model``), not a
hand-written copy of it. Requests are routed the way the model says they are sent (``X-Amz-Target`` for JSON
1.1, ``http.requestUri`` and method for rest-json, ``Action`` for query), and responses are written by walking
the operation's output shape. That walk is strict on purpose: botocore's parsers silently drop keys that are
not members of the shape, so a misspelt field would otherwise vanish on the client side without any error.
Here it becomes a 500 ``InternalFailure`` that names the field, and the emulator's tests catch it.
"""

from __future__ import annotations

import base64
import datetime as dt
import functools
import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote
from xml.sax.saxutils import escape

import botocore.session
from botocore.model import OperationModel, ServiceModel, Shape

# SigV4: "AWS4-HMAC-SHA256 Credential=AKID/20250101/us-east-1/sagemaker/aws4_request, SignedHeaders=..."
_SCOPE = re.compile(r"Credential=[^/,\s]+/\d{8}/([a-z0-9-]+)/([a-z0-9-]+)/aws4_request")
DEFAULT_REGION = "us-east-1"


class AwsError(Exception):
    """An error the emulator answers with, shaped like the real service's (code, message, HTTP status).

    ``status`` None means: the status the service model declares for ``code``, else 400 (SageMaker declares
    none, and the real service answers 400 for its client errors). ``fields`` are extra members of the
    error body, such as EKS's ``clusterName`` and ``addonName``.
    """

    def __init__(self, code: str, message: str, *, status: int | None = None, **fields: Any) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status
        self.fields = fields


class EmulatorBug(Exception):
    """A handler produced a value its output shape does not allow (answered as 500 InternalFailure)."""


@dataclass
class WireRequest:
    method: str
    path: str
    query: str
    headers: dict[str, str]  # lower-cased names
    body: bytes


@dataclass
class WireResponse:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


def credential_scope(headers: dict[str, str]) -> tuple[str | None, str]:
    """(service, region) from the SigV4 Authorization header; service None when unsigned or not SigV4."""
    match = _SCOPE.search(headers.get("authorization", ""))
    if match is None:
        return None, DEFAULT_REGION
    return match.group(2), match.group(1)


@functools.cache
def load_model(service: str) -> ServiceModel:
    # Loading SageMaker's model takes a noticeable fraction of a second; every emulator shares one copy.
    return botocore.session.get_session().get_service_model(service)


def page_of(
    items: list[Any], max_results: int | None, token: str | None, *, code: str
) -> tuple[list[Any], str | None]:
    """One page of ``items`` and the token of the next page (an offset; clients treat tokens as opaque)."""
    try:
        start = int(token) if token else 0
    except ValueError:
        raise AwsError(code, f"Invalid pagination token: {token}") from None
    size = max_results or 100
    end = start + size
    return items[start:end], (str(end) if end < len(items) else None)


# --- output shape walking ---------------------------------------------------------------------------------


def _epoch(value: Any) -> float:
    if isinstance(value, dt.datetime):
        return value.timestamp()
    return float(value)


def _iso(value: Any) -> str:
    if not isinstance(value, dt.datetime):
        value = dt.datetime.fromtimestamp(float(value), tz=dt.UTC)
    return str(value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f"))[:-3] + "Z"


def _scalar(shape: Shape, value: Any, where: str) -> Any:
    kind = shape.type_name
    if kind == "timestamp":
        return value  # converted by the protocol
    if kind == "blob":
        raw = value.encode() if isinstance(value, str) else value
        return base64.b64encode(raw).decode()
    types: dict[str, type | tuple[type, ...]] = {
        "string": str,
        "boolean": bool,
        "integer": int,
        "long": int,
        "float": (int, float),
        "double": (int, float),
    }
    expected = types.get(kind, object)
    if not isinstance(value, expected) or (kind in ("integer", "long") and isinstance(value, bool)):
        raise EmulatorBug(f"{where}: {value!r} is not a {kind}")
    return value


def to_json_value(shape: Shape, value: Any, where: str = "") -> Any:
    """``value`` written for the JSON protocols, checked against ``shape`` (unknown members are bugs)."""
    if shape.type_name == "structure":
        if not isinstance(value, dict):
            raise EmulatorBug(f"{where or shape.name}: expected a structure, got {value!r}")
        out = {}
        for key, item in value.items():
            if item is None:
                continue
            member = shape.members.get(key)
            if member is None:
                raise EmulatorBug(f"{where or shape.name}.{key} is not a member of {shape.name}")
            wire_key = shape.members[key].serialization.get("name", key)
            out[wire_key] = to_json_value(member, item, f"{where or shape.name}.{key}")
        return out
    if shape.type_name == "list":
        return [to_json_value(shape.member, item, f"{where}[{i}]") for i, item in enumerate(value)]
    if shape.type_name == "map":
        return {k: to_json_value(shape.value, v, f"{where}[{k}]") for k, v in value.items()}
    if shape.type_name == "timestamp":
        return _iso(value) if shape.serialization.get("timestampFormat") == "iso8601" else _epoch(value)
    return _scalar(shape, value, where)


def _xml_members(shape: Shape, value: dict[str, Any], where: str) -> str:
    parts = []
    for key, item in value.items():
        if item is None:
            continue
        member = shape.members.get(key)
        if member is None:
            raise EmulatorBug(f"{where}.{key} is not a member of {shape.name}")
        name = member.serialization.get("name", key)
        parts.append(f"<{name}>{_xml_value(member, item, f'{where}.{key}')}</{name}>")
    return "".join(parts)


def _xml_value(shape: Shape, value: Any, where: str) -> str:
    if shape.type_name == "structure":
        return _xml_members(shape, value, where)
    if shape.type_name == "list":
        tag = shape.member.serialization.get("name", "member")
        return "".join(f"<{tag}>{_xml_value(shape.member, v, where)}</{tag}>" for v in value)
    if shape.type_name == "map":
        return "".join(
            f"<entry><key>{escape(str(k))}</key><value>{_xml_value(shape.value, v, where)}</value></entry>"
            for k, v in value.items()
        )
    if shape.type_name == "timestamp":
        return _iso(value)
    text = _scalar(shape, value, where)
    if isinstance(text, bool):
        return "true" if text else "false"
    return escape(str(text))


# --- codecs -----------------------------------------------------------------------------------------------


class Codec:
    """Decodes requests and encodes answers for one service, per its model's protocol."""

    missing_code = "ValidationException"

    def __init__(self, model: ServiceModel) -> None:
        self.model = model
        self.service = model.service_name

    def parse(self, request: WireRequest) -> tuple[str, dict[str, Any]]:
        raise NotImplementedError

    def encode_result(self, operation: str, result: dict[str, Any]) -> WireResponse:
        raise NotImplementedError

    def encode_error(self, error: AwsError) -> WireResponse:
        raise NotImplementedError

    def status_of(self, error: AwsError) -> int:
        if error.status is not None:
            return error.status
        try:
            shape = self.model.shape_for(error.code)
        except Exception:
            return 400
        return int(shape.metadata.get("error", {}).get("httpStatusCode", 400))

    def check_required(self, operation: str, params: dict[str, Any]) -> None:
        """Refuse a request that lacks a required member, as the service does when the client skips
        its own validation (``parameter_validation=False``)."""
        shape = self._operation(operation).input_shape
        missing = [m for m in (shape.required_members if shape else []) if m not in params]
        if missing:
            raise AwsError(
                self.missing_code, f"Missing required parameter(s) {', '.join(missing)} in {operation}"
            )

    def _operation(self, name: str) -> OperationModel:
        if name not in self.model.operation_names:
            raise AwsError("UnknownOperationException", f"{self.service} has no operation {name!r}")
        return self.model.operation_model(name)


def _request_id() -> str:
    return str(uuid.uuid4())


def _json_body(body: bytes) -> dict[str, Any]:
    if not body.strip():
        return {}
    try:
        value = json.loads(body)
    except ValueError as exc:
        raise AwsError("SerializationException", f"request body is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise AwsError("SerializationException", "request body must be a JSON object")
    return value


class JsonCodec(Codec):
    """AWS JSON 1.0/1.1 (SageMaker): ``X-Amz-Target: <prefix>.<Operation>``, JSON in and out."""

    missing_code = "ValidationException"

    def parse(self, request: WireRequest) -> tuple[str, dict[str, Any]]:
        target = request.headers.get("x-amz-target", "")
        operation = target.rpartition(".")[2]
        self._operation(operation)
        return operation, _json_body(request.body)

    def _content_type(self) -> str:
        return f"application/x-amz-json-{self.model.metadata.get('jsonVersion', '1.1')}"

    def encode_result(self, operation: str, result: dict[str, Any]) -> WireResponse:
        shape = self._operation(operation).output_shape
        payload = to_json_value(shape, result) if shape is not None else {}
        return WireResponse(200, json.dumps(payload).encode(), {"content-type": self._content_type()})

    def encode_error(self, error: AwsError) -> WireResponse:
        payload = {"__type": error.code, "Message": error.message, **error.fields}
        return WireResponse(
            self.status_of(error), json.dumps(payload).encode(), {"content-type": self._content_type()}
        )


def route_pattern(request_uri: str) -> re.Pattern[str]:
    path = request_uri.split("?", 1)[0]
    regex, labels = "", []
    for literal, label in re.findall(r"([^{]*)(?:\{([^}]+)\})?", path):
        regex += re.escape(literal)
        if label:
            greedy = label.endswith("+")
            labels.append(label.rstrip("+"))
            regex += f"(?P<g{len(labels) - 1}>{'.+' if greedy else '[^/]+'})"
    return re.compile(f"^{regex}/?$")


def _from_text(shape: Shape, text: str) -> Any:
    if shape.type_name in ("integer", "long"):
        try:
            return int(text)
        except ValueError:
            raise AwsError("InvalidParameterException", f"{text!r} is not an integer") from None
    if shape.type_name == "boolean":
        return text.lower() == "true"
    return text


class RestJsonCodec(Codec):
    """rest-json (EKS): the operation is found from the method and the model's ``http.requestUri``."""

    missing_code = "InvalidParameterException"

    def __init__(self, model: ServiceModel) -> None:
        super().__init__(model)
        routes = []
        for name in model.operation_names:
            http = model.operation_model(name).http
            uri = http.get("requestUri", "/")
            specificity = len(re.sub(r"\{[^}]*\}", "", uri))
            routes.append((specificity, http.get("method", "POST"), route_pattern(uri), name, uri))
        routes.sort(key=lambda r: -r[0])
        self._routes = routes

    def _match(self, method: str, path: str) -> tuple[str, dict[str, str]]:
        for _, route_method, pattern, name, uri in self._routes:
            found = pattern.match(path)
            if found and route_method == method:
                labels = [label.rstrip("+") for label in re.findall(r"\{([^}]+)\}", uri.split("?")[0])]
                return name, {labels[int(k[1:])]: unquote(v) for k, v in found.groupdict().items()}
        raise AwsError(
            "UnknownOperationException", f"no {self.service} operation for {method} {path}", status=404
        )

    def parse(self, request: WireRequest) -> tuple[str, dict[str, Any]]:
        name, labels = self._match(request.method, request.path)
        shape = self.model.operation_model(name).input_shape
        query = parse_qs(request.query, keep_blank_values=True)
        body = _json_body(request.body)
        params: dict[str, Any] = {}
        for member, member_shape in shape.members.items() if shape else ():
            where = member_shape.serialization.get("location")
            wire = member_shape.serialization.get("name", member)
            if where == "uri" and wire in labels:
                params[member] = labels[wire]
            elif where == "querystring" and wire in query:
                values = query[wire]
                params[member] = (
                    [_from_text(member_shape.member, v) for v in values]
                    if member_shape.type_name == "list"
                    else _from_text(member_shape, values[-1])
                )
            elif where == "header" and wire.lower() in request.headers:
                params[member] = _from_text(member_shape, request.headers[wire.lower()])
            elif where is None and wire in body:
                params[member] = body[wire]
        return name, params

    def encode_result(self, operation: str, result: dict[str, Any]) -> WireResponse:
        shape = self._operation(operation).output_shape
        payload = to_json_value(shape, result) if shape is not None else {}
        return WireResponse(200, json.dumps(payload).encode(), {"content-type": "application/json"})

    def encode_error(self, error: AwsError) -> WireResponse:
        payload = {"message": error.message, **error.fields}
        headers = {"content-type": "application/json", "x-amzn-errortype": error.code}
        return WireResponse(self.status_of(error), json.dumps(payload).encode(), headers)


class QueryCodec(Codec):
    """AWS query (STS): form-encoded ``Action=...`` in, XML out with the operation's ``resultWrapper``."""

    missing_code = "MissingParameter"

    def parse(self, request: WireRequest) -> tuple[str, dict[str, Any]]:
        form = parse_qs(request.body.decode() or request.query, keep_blank_values=True)
        flat = {key: values[-1] for key, values in form.items()}
        operation = flat.pop("Action", "")
        flat.pop("Version", None)
        self._operation(operation)
        return operation, flat

    def _namespace(self) -> str:
        return str(self.model.metadata.get("xmlNamespace", ""))

    def encode_result(self, operation: str, result: dict[str, Any]) -> WireResponse:
        shape = self._operation(operation).output_shape
        inner = _xml_members(shape, result, shape.name) if shape is not None else ""
        wrapper = shape.serialization.get("resultWrapper") if shape is not None else None
        if wrapper:
            inner = f"<{wrapper}>{inner}</{wrapper}>"
        xml = (
            f'<{operation}Response xmlns="{self._namespace()}">{inner}'
            f"<ResponseMetadata><RequestId>{_request_id()}</RequestId></ResponseMetadata>"
            f"</{operation}Response>"
        )
        return WireResponse(200, xml.encode(), {"content-type": "text/xml"})

    def encode_error(self, error: AwsError) -> WireResponse:
        status = self.status_of(error)
        kind = "Sender" if status < 500 else "Receiver"
        xml = (
            f'<ErrorResponse xmlns="{self._namespace()}"><Error><Type>{kind}</Type>'
            f"<Code>{escape(error.code)}</Code><Message>{escape(error.message)}</Message></Error>"
            f"<RequestId>{_request_id()}</RequestId></ErrorResponse>"
        )
        return WireResponse(status, xml.encode(), {"content-type": "text/xml"})


_CODECS = {"json": JsonCodec, "rest-json": RestJsonCodec, "query": QueryCodec}


def codec_for(service: str) -> Codec:
    model = load_model(service)
    return _CODECS[model.protocol](model)
