"""Warren's Python SDK.

``warren.SandboxClient`` (async) and ``warren.sync.SandboxClient`` speak
Warren's extended API; ``warren.msb`` has microsandbox's classes;
``warren.enclave`` is a sandbox type for ms-enclave. Names are loaded on
first use, so ``import warren`` stays cheap (no asyncio until needed).
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "SandboxClient": "client", "Sandbox": "client", "Process": "client", "Session": "client",
    "ExecResult": "base", "SandboxSpec": "base", "SandboxHandle": "base", "SandboxUnavailable": "base",
    "SandboxInfo": "types", "ExecDetails": "types", "FileInfo": "types", "ProcessInfo": "types",
    "OutputChunk": "types", "OutputLine": "types", "ReplResult": "types", "Metrics": "types",
    "StreamEvent": "types",
    "WarrenError": "errors", "ProtocolError": "errors", "InvalidParams": "errors", "Unauthorized": "errors",
    "Forbidden": "errors", "NotFound": "errors", "Conflict": "errors", "TooLarge": "errors",
    "LimitExceeded": "errors", "Timeout": "errors", "ExecFailed": "errors", "Unavailable": "errors",
    "Unsupported": "errors", "InternalError": "errors", "ServerUnreachable": "errors",
}
__all__ = ["Conflict", "ExecDetails", "ExecFailed", "ExecResult", "FileInfo", "Forbidden", "InternalError",
    "InvalidParams", "LimitExceeded", "Metrics", "NotFound", "OutputChunk", "OutputLine", "Process",
    "ProcessInfo", "ProtocolError", "ReplResult", "Sandbox", "SandboxClient", "SandboxHandle", "SandboxInfo",
    "SandboxSpec", "SandboxUnavailable", "ServerUnreachable", "Session", "StreamEvent", "Timeout",
    "TooLarge", "Unauthorized", "Unavailable", "Unsupported", "WarrenError"]

if TYPE_CHECKING:
    from .base import ExecResult, SandboxHandle, SandboxSpec, SandboxUnavailable
    from .client import Process, Sandbox, SandboxClient, Session
    from .errors import (Conflict, ExecFailed, Forbidden, InternalError, InvalidParams, LimitExceeded, NotFound,
                         ProtocolError, ServerUnreachable, Timeout, TooLarge, Unauthorized, Unavailable,
                         Unsupported, WarrenError)
    from .types import (ExecDetails, FileInfo, Metrics, OutputChunk, OutputLine, ProcessInfo, ReplResult,
                        SandboxInfo, StreamEvent)


def __getattr__(name: str) -> Any:
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'warren' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{mod}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
