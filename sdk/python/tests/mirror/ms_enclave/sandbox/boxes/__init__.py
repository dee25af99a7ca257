from __future__ import annotations

from typing import Any

from ..model import SandboxConfig
from .base import _REGISTRY, Sandbox, register_sandbox

__all__ = ["Sandbox", "SandboxFactory", "register_sandbox"]


class SandboxFactory:
    @staticmethod
    def create_sandbox(kind: Any, config: SandboxConfig) -> Sandbox:
        if kind not in _REGISTRY:
            raise ValueError(f"unknown sandbox type {kind!r}")
        return _REGISTRY[kind](config)
