"""The agent platform's sandbox surface: the types and abstract classes agent
code programs against (fields, defaults and signatures as the platform
defines them). :class:`warren.SandboxClient` implements them over Warren.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Dict, Optional, Sequence, Tuple


@dataclass(frozen=True)
class ExecResult:
    """Result of a command run inside a sandbox."""

    stdout: str
    stderr: str = ""
    exit_code: int = 0
    truncated: bool = False

    @property
    def output(self) -> str:
        """stdout followed by stderr."""
        return self.stdout + (self.stderr or "")

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclass(frozen=True)
class SandboxSpec:
    """What :meth:`SandboxClient.create` is asked for."""

    name: str
    image: str = "python:3.11-slim"
    memory_mib: int = 512
    cpus: int = 1
    # Mounted read-write at /workspace (a workspace of the namespace).
    workspace: Optional[str] = None
    # Names of secrets the server resolves and injects; values never pass here.
    secrets: Tuple[str, ...] = ()
    # Egress allowlist; empty: nothing leaves the sandbox.
    egress: Tuple[str, ...] = ()
    # Free-form labels (audit, billing, sandbox.list filters).
    labels: Dict[str, str] = field(default_factory=dict)


class SandboxHandle(ABC):
    """A live sandbox."""

    name: str

    @abstractmethod
    async def exec(
        self,
        cmd: str,
        args: Optional[Sequence[str]] = None,
        *,
        timeout: Optional[float] = None,
    ) -> ExecResult: ...

    @abstractmethod
    async def shell(self, script: str, *, timeout: Optional[float] = None) -> ExecResult: ...

    @abstractmethod
    async def stop(self) -> None: ...

    @abstractmethod
    async def kill(self) -> None: ...

    @abstractmethod
    async def logs(self, *, tail: Optional[int] = None) -> str: ...


class SandboxClient(ABC):
    """What agents are handed to run code."""

    @abstractmethod
    async def create(self, spec: SandboxSpec) -> SandboxHandle: ...

    @abstractmethod
    async def get(self, name: str) -> SandboxHandle: ...

    @abstractmethod
    async def list(self) -> list[str]: ...

    @abstractmethod
    async def remove(self, name: str) -> None: ...

    async def run_python(
        self, code: str, *, image: str = "python:3.11-slim", **kwargs: Any
    ) -> ExecResult:
        """A one-shot sandbox: create, ``python -c code``, stop and remove
        (always, whatever happened). ``kwargs`` are further SandboxSpec fields."""
        return await self._one_shot("py-", image, kwargs, lambda sb: sb.exec("python", ["-c", code]))

    async def run_shell(
        self, script: str, *, image: str = "python:3.11-slim", **kwargs: Any
    ) -> ExecResult:
        """A one-shot sandbox: create, run ``script`` with /bin/sh, stop and
        remove (always)."""
        return await self._one_shot("sh-", image, kwargs, lambda sb: sb.shell(script))

    async def _one_shot(
        self,
        prefix: str,
        image: str,
        kwargs: Dict[str, Any],
        run: Callable[[SandboxHandle], Awaitable[ExecResult]],
    ) -> ExecResult:
        import asyncio
        import uuid

        spec = SandboxSpec(name=f"{prefix}{uuid.uuid4().hex[:8]}", image=image, **kwargs)
        sb = await self.create(spec)
        try:
            return await run(sb)
        finally:
            # Shielded: a cancelled caller still gets its sandbox torn down.
            await asyncio.shield(self._teardown(sb, spec.name))

    async def _teardown(self, sb: SandboxHandle, name: str) -> None:
        try:
            await sb.stop()
        except Exception:  # noqa: BLE001 - the run's outcome matters more
            pass
        try:
            await self.remove(name)
        except Exception:  # noqa: BLE001
            pass


class SandboxUnavailable(RuntimeError):
    """Raised when a sandbox runtime is asked for but none is attached."""
