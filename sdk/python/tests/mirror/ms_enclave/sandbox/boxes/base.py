from __future__ import annotations

import abc
import uuid
from typing import Any, Callable, Dict, List, Optional, Tuple, Type, TypeVar, Union

from ..model import SandboxConfig, SandboxStatus

_REGISTRY: Dict[Any, Type["Sandbox"]] = {}
C = TypeVar("C", bound=Type["Sandbox"])


def register_sandbox(kind: Any) -> Callable[[C], C]:
    def deco(cls: C) -> C:
        _REGISTRY[kind] = cls
        return cls
    return deco


class Sandbox(abc.ABC):
    def __init__(self, config: SandboxConfig, sandbox_id: Optional[str] = None) -> None:
        self.id = sandbox_id or uuid.uuid4().hex
        self.config = config
        self.status = SandboxStatus.INITIALIZING
        self.metadata: Dict[str, Any] = {}
        self.tools: Dict[str, Callable[..., Any]] = {}

    @property
    @abc.abstractmethod
    def sandbox_type(self) -> Any: ...

    def update_status(self, status: SandboxStatus) -> None:
        self.status = status

    async def initialize_tools(self) -> None:
        async def hello(name: str) -> str:
            return f"hello {name}"
        self.tools["hello"] = hello

    async def execute_tool(self, name: str, params: Dict[str, Any]) -> Any:
        return await self.tools[name](**params)

    @abc.abstractmethod
    async def start(self) -> None: ...

    @abc.abstractmethod
    async def stop(self) -> None: ...

    @abc.abstractmethod
    async def cleanup(self) -> None: ...

    @abc.abstractmethod
    async def execute_command(self, command: Union[str, List[str]], timeout: Optional[int] = None,
                              stream: bool = True) -> Tuple[int, str, str]: ...

    @abc.abstractmethod
    async def get_execution_context(self) -> Any: ...

    def get_info(self) -> Dict[str, Any]:
        return {"id": self.id, "type": self.sandbox_type, "status": self.status, "metadata": dict(self.metadata)}

    async def __aenter__(self) -> "Sandbox":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.stop()
        finally:
            await self.cleanup()
