"""microsandbox's Python classes on Warren's transport: code written for
microsandbox runs by changing its import to ``from warren.msb import
PythonSandbox``.

Speaks only the five microsandbox methods (sandbox.start, sandbox.stop,
sandbox.repl.run, sandbox.command.run, sandbox.metrics.get), so it works
against a microsandbox server too. ``remote`` is accepted and ignored: every
sandbox is on the server named by ``server_url`` / ``MSB_SERVER_URL``.
Failures raise warren's typed errors (warren.errors), which are
RuntimeErrors as microsandbox's are, carrying the server's kind.
"""
from __future__ import annotations

import asyncio
import uuid
from abc import ABC, abstractmethod
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Dict, List, Optional, Type, TypeVar

from ._transport import Transport
from .client import _thread
from .types import OutputLine, parse_lines

S = TypeVar("S", bound="BaseSandbox")


class BaseSandbox(ABC):
    """A sandbox of a microsandbox-compatible server."""

    def __init__(
        self,
        remote: bool = False,
        server_url: Optional[str] = None,
        namespace: str = "default",
        name: Optional[str] = None,
        api_key: Optional[str] = None,
    ) -> None:
        self.remote = remote
        self._transport = Transport(server_url, api_key)
        self._server_url = self._transport.server_url
        self._namespace = namespace
        self._name = name or f"sandbox-{uuid.uuid4().hex[:8]}"
        self._is_started = False

    @property
    def name(self) -> str:
        return self._name

    @property
    def namespace(self) -> str:
        return self._namespace

    @property
    def is_started(self) -> bool:
        return self._is_started

    @abstractmethod
    async def get_default_image(self) -> str:
        """The image a start without one uses."""

    @classmethod
    @asynccontextmanager
    async def create(
        cls: Type[S],
        remote: bool = False,
        server_url: Optional[str] = None,
        namespace: str = "default",
        name: Optional[str] = None,
        api_key: Optional[str] = None,
    ) -> AsyncIterator[S]:
        """Starts a sandbox for the ``async with`` block and stops it after, however it ends."""
        sandbox = cls(remote=remote, server_url=server_url, namespace=namespace, name=name, api_key=api_key)
        try:
            await sandbox.start()
            yield sandbox
        finally:
            await asyncio.shield(sandbox._final_stop())

    async def _final_stop(self) -> None:
        try:
            await self.stop()
        finally:
            self._transport.close()

    async def _call(self, method: str, params: Dict[str, Any], timeout: Optional[float] = None,
                    idempotent: bool = False) -> Any:
        p = {"sandbox": self._name, "namespace": self._namespace}
        p.update(params)
        return await _thread(self._transport.call, method, p, timeout=timeout, idempotent=idempotent)

    async def start(self, image: Optional[str] = None, memory: int = 512, cpus: float = 1.0,
                    timeout: float = 180.0) -> None:
        """Starts the sandbox (``memory`` in MiB); waits up to ``timeout`` seconds (+30 for the answer)."""
        if self._is_started:
            return
        config = {"image": image or await self.get_default_image(), "memory": memory, "cpus": int(round(cpus))}
        await self._call("sandbox.start", {"config": config}, timeout=timeout + 30)
        self._is_started = True

    async def stop(self) -> None:
        if not self._is_started:
            return
        await self._call("sandbox.stop", {}, idempotent=True)
        self._is_started = False

    @abstractmethod
    async def run(self, code: str) -> "Execution":
        """Runs code in the sandbox's interpreter."""

    async def _repl(self, language: str, code: str, timeout: Optional[float]) -> "Execution":
        if not self._is_started:
            raise RuntimeError("Sandbox is not started. Call start() first.")
        p: Dict[str, Any] = {"language": language, "code": code}
        if timeout:
            p["timeout"] = timeout
        res = await self._call("sandbox.repl.run", p, timeout=(timeout or 86400) + 60)
        return Execution(res if isinstance(res, dict) else {})

    @property
    def command(self) -> "Command":
        return Command(self)

    @property
    def metrics(self) -> "Metrics":
        return Metrics(self)


class PythonSandbox(BaseSandbox):
    async def get_default_image(self) -> str:
        return "microsandbox/python"

    async def run(self, code: str, timeout: Optional[float] = None) -> "Execution":
        return await self._repl("python", code, timeout)


class NodeSandbox(BaseSandbox):
    async def get_default_image(self) -> str:
        return "microsandbox/node"

    async def run(self, code: str, timeout: Optional[float] = None) -> "Execution":
        return await self._repl("nodejs", code, timeout)


class Execution:
    """A REPL run: its output lines, in order."""

    def __init__(self, output_data: Dict[str, Any]) -> None:
        self._output_lines: List[OutputLine] = list(parse_lines(output_data.get("output")))
        self._status = str(output_data.get("status") or "unknown")
        self._language = str(output_data.get("language") or "unknown")
        self._has_error = self._status in ("error", "exception") or any(
            x.stream == "stderr" and x.text for x in self._output_lines)

    @property
    def status(self) -> str:
        return self._status

    @property
    def language(self) -> str:
        return self._language

    async def output(self) -> str:
        return "".join(x.text + "\n" for x in self._output_lines if x.stream == "stdout")

    async def error(self) -> str:
        return "".join(x.text + "\n" for x in self._output_lines if x.stream == "stderr")

    def has_error(self) -> bool:
        return self._has_error


class CommandExecution:
    """A command's run: exit code and output lines."""

    def __init__(self, output_data: Dict[str, Any]) -> None:
        self._output_lines: List[OutputLine] = list(parse_lines(output_data.get("output")))
        self._command = str(output_data.get("command") or "")
        args = output_data.get("args")
        self._args = [str(a) for a in args] if isinstance(args, list) else []
        code = output_data.get("exit_code")
        self._exit_code = code if isinstance(code, int) else -1
        self._success = bool(output_data.get("success"))

    async def output(self) -> str:
        return "".join(x.text + "\n" for x in self._output_lines if x.stream == "stdout")

    async def error(self) -> str:
        return "".join(x.text + "\n" for x in self._output_lines if x.stream == "stderr")

    @property
    def exit_code(self) -> int:
        return self._exit_code

    @property
    def success(self) -> bool:
        return self._success

    @property
    def command(self) -> str:
        return self._command

    @property
    def args(self) -> List[str]:
        return self._args


class Command:
    def __init__(self, sandbox: BaseSandbox) -> None:
        self._sandbox = sandbox

    async def run(self, command: str, args: Optional[List[str]] = None,
                  timeout: Optional[float] = None) -> CommandExecution:
        """Runs ``command`` with ``args`` directly (no shell). A non-zero exit is
        a result; a command that cannot start or runs past ``timeout`` raises."""
        if not self._sandbox.is_started:
            raise RuntimeError("Sandbox is not started. Call start() first.")
        p: Dict[str, Any] = {"command": command, "args": list(args or [])}
        if timeout:
            p["timeout"] = timeout
        res = await self._sandbox._call("sandbox.command.run", p, timeout=(timeout or 86400) + 60)
        return CommandExecution(res if isinstance(res, dict) else {})


class Metrics:
    def __init__(self, sandbox: BaseSandbox) -> None:
        self._sandbox = sandbox

    async def _get(self) -> Dict[str, Any]:
        if not self._sandbox.is_started:
            raise RuntimeError("Sandbox is not started. Call start() first.")
        res = await self._sandbox._call("sandbox.metrics.get", {}, idempotent=True)
        items = res.get("sandboxes") if isinstance(res, dict) else None
        if not items or not isinstance(items[0], dict):
            return {}
        first: Dict[str, Any] = items[0]
        return first

    async def all(self) -> Dict[str, Any]:
        return await self._get()

    async def cpu(self) -> Optional[float]:
        v = (await self._get()).get("cpu_usage")
        return float(v) if isinstance(v, (int, float)) else None

    async def memory(self) -> Optional[int]:
        v = (await self._get()).get("memory_usage")
        return int(v) if isinstance(v, (int, float)) else None

    async def disk(self) -> Optional[int]:
        v = (await self._get()).get("disk_usage")
        return int(v) if isinstance(v, (int, float)) else None

    async def is_running(self) -> bool:
        return bool((await self._get()).get("running"))
