"""Errors: one class per kind the server reports in ``error.data.kind``.

Every failure the server answers is a :class:`WarrenError` subclass chosen by
its kind (docs/api.md, "Errors"); a server that cannot be reached at all is
:class:`ServerUnreachable`. Where a builtin exception means the same thing
the class derives from it too, so ``except TimeoutError`` or
``except PermissionError`` keep working.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Type


class WarrenError(RuntimeError):
    """A failure reported by the server (or the transport)."""

    kind: str = ""

    def __init__(
        self,
        message: str,
        *,
        kind: str = "",
        http_status: int = 0,
        code: int = 0,
        data: Optional[Dict[str, Any]] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if kind:
            self.kind = kind
        self.http_status = http_status
        self.code = code
        self.data: Dict[str, Any] = data or {}

    def __str__(self) -> str:
        return self.message


class ProtocolError(WarrenError):
    """parse_error, invalid_request, method_not_found, or an answer that is not JSON-RPC."""


class InvalidParams(WarrenError, ValueError):
    kind = "invalid_params"


class Unauthorized(WarrenError, PermissionError):
    """No key, or a malformed, expired or revoked one (HTTP 401)."""

    kind = "unauthorized"


class Forbidden(WarrenError, PermissionError):
    kind = "forbidden"


class NotFound(WarrenError, LookupError):
    kind = "not_found"


class Conflict(WarrenError):
    kind = "conflict"


class TooLarge(WarrenError):
    kind = "too_large"


class LimitExceeded(WarrenError):
    kind = "limit"


class Timeout(WarrenError, TimeoutError):
    kind = "timeout"


class ExecFailed(WarrenError):
    kind = "exec_failed"


class Unavailable(WarrenError):
    kind = "unavailable"


class Unsupported(WarrenError, NotImplementedError):
    kind = "unsupported"


class InternalError(WarrenError):
    kind = "internal"


class ServerUnreachable(WarrenError, ConnectionError):
    """The server could not be reached, or the connection broke mid-call."""


KIND_CLASSES: Dict[str, Type[WarrenError]] = {
    "parse_error": ProtocolError,
    "invalid_request": ProtocolError,
    "method_not_found": ProtocolError,
    "invalid_params": InvalidParams,
    "unauthorized": Unauthorized,
    "forbidden": Forbidden,
    "not_found": NotFound,
    "conflict": Conflict,
    "too_large": TooLarge,
    "limit": LimitExceeded,
    "timeout": Timeout,
    "exec_failed": ExecFailed,
    "unavailable": Unavailable,
    "unsupported": Unsupported,
    "internal": InternalError,
}

# For answers whose error object lacks data.kind.
_CODE_KINDS = {
    -32700: "parse_error", -32600: "invalid_request", -32601: "method_not_found",
    -32602: "invalid_params", -32001: "unauthorized", -32002: "forbidden",
    -32003: "not_found", -32004: "conflict", -32005: "too_large", -32006: "limit",
    -32007: "timeout", -32008: "exec_failed", -32009: "unavailable",
    -32010: "unsupported", -32603: "internal",
}
# For answers with no error object at all (a proxy's page). 400 and 404 are
# ambiguous and left out.
_STATUS_KINDS = {
    401: "unauthorized", 403: "forbidden", 409: "conflict", 413: "too_large",
    429: "limit", 504: "timeout", 422: "exec_failed", 503: "unavailable",
    501: "unsupported", 500: "internal",
}


def from_answer(status: int, err: Any, fallback: str) -> WarrenError:
    """Builds the error for a JSON-RPC error object ``err`` (or None) answered with ``status``."""
    if isinstance(err, dict):
        data = err.get("data")
        data = data if isinstance(data, dict) else {}
        code = err.get("code")
        code = code if isinstance(code, int) else 0
        kind = data.get("kind")
        if not isinstance(kind, str) or not kind:
            kind = _CODE_KINDS.get(code, _STATUS_KINDS.get(status, ""))
        msg = err.get("message")
        message = msg if isinstance(msg, str) and msg else fallback
        cls = KIND_CLASSES.get(kind, WarrenError)
        return cls(message, kind=kind, http_status=status, code=code, data=data)
    kind = _STATUS_KINDS.get(status, "")
    cls = KIND_CLASSES.get(kind, ProtocolError if not kind else WarrenError)
    return cls(fallback, kind=kind, http_status=status)
