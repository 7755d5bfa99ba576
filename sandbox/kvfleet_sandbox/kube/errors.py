"""``ApiError``: a refusal the emulator renders as a Kubernetes ``Status`` object.

Raised anywhere in the store, the patch engine, validation or admission hooks; ``server`` turns it into the
HTTP status and ``Status`` body the real apiserver would send, so clients raise their usual exceptions
(``kubernetes.client.ApiException``, kubectl's ``Error from server (Conflict)``, helm's messages).
"""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """An apiserver refusal: HTTP code, machine reason (``NotFound``, ``Conflict``…) and message."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": self.message, "reason": self.reason, "code": self.code,
        }
        if self.details:
            body["details"] = self.details
        return body


def not_found(group: str, resource: str, name: str) -> ApiError:
    qualified = f"{resource}.{group}" if group else resource
    return ApiError(404, "NotFound", f'{qualified} "{name}" not found',
                    {"name": name, "group": group, "kind": resource})


def already_exists(group: str, resource: str, name: str) -> ApiError:
    qualified = f"{resource}.{group}" if group else resource
    return ApiError(409, "AlreadyExists", f'{qualified} "{name}" already exists',
                    {"name": name, "group": group, "kind": resource})


def conflict(group: str, resource: str, name: str) -> ApiError:
    qualified = f"{resource}.{group}" if group else resource
    return ApiError(409, "Conflict",
                    f'Operation cannot be fulfilled on {qualified} "{name}": the object has been modified; '
                    "please apply your changes to the latest version and try again",
                    {"name": name, "group": group, "kind": resource})


def invalid(kind: str, group: str, name: str, causes: list[tuple[str, str]]) -> ApiError:
    """422 Invalid with the apiserver's wording: ``Kind.group "name" is invalid: field: reason``."""
    qualified = f"{kind}.{group}" if group else kind
    messages = [f"{f}: {m}" if f else m for f, m in causes]
    joined = messages[0] if len(messages) == 1 else "[" + ", ".join(messages) + "]"
    return ApiError(422, "Invalid", f'{qualified} "{name}" is invalid: {joined}', {
        "name": name, "group": group, "kind": kind,
        "causes": [{"reason": "FieldValueInvalid", "message": m, "field": f}
                   for f, m in causes],
    })
