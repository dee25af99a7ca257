from __future__ import annotations

import enum
from typing import Any


class SandboxType(str, enum.Enum):
    DOCKER = "docker"
    LOCAL_PROCESS = "local_process"


class SandboxStatus(str, enum.Enum):
    INITIALIZING = "initializing"
    RUNNING = "running"
    STOPPED = "stopped"
    ERROR = "error"


class SandboxConfig:
    """Keyword fields over class-level defaults (as a settings model)."""

    timeout: int = 30

    def __init__(self, **kwargs: Any) -> None:
        for k, v in kwargs.items():
            setattr(self, k, v)
