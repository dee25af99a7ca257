"""A sandbox type for ms-enclave backed by Warren.

Importing this module registers :class:`WarrenSandbox` with ms-enclave's
``register_sandbox`` under ``SandboxType.WARREN`` when ms-enclave's enum has
that member (ms-enclave's documented way: extend the enum first), else under
the string ``"warren"``. It needs ms-enclave installed (``ms_enclave``);
this project tests it against a mirror of ms-enclave's documented interface
(sdk/python/tests/mirror), since ms-enclave itself cannot be installed here.

State machine: INITIALIZING → RUNNING (start) → STOPPED (stop); any failure
of start, stop or cleanup, and a run that finds the sandbox gone, sets ERROR
and records ``metadata["error"]``. Transitions are serialized by a lock;
commands run concurrently (Warren runs each in its own process).
"""
from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, Dict, List, Optional, Tuple, Union

from ms_enclave.sandbox.boxes.base import Sandbox, register_sandbox
from ms_enclave.sandbox.model import SandboxConfig, SandboxStatus, SandboxType

from . import sync
from .client import _thread
from .base import SandboxSpec
from .errors import Conflict, NotFound, ServerUnreachable

CommandResult = Tuple[int, str, str]
SANDBOX_TYPE: Any = getattr(SandboxType, "WARREN", "warren")


class WarrenSandboxConfig(SandboxConfig):
    """Settings of a Warren sandbox (every one optional). ``server_url`` and
    ``api_key`` default to MSB_SERVER_URL and MSB_API_KEY."""

    image: str = "python"
    memory_mib: int = 512
    cpus: int = 1
    server_url: Optional[str] = None
    api_key: Optional[str] = None
    namespace: Optional[str] = None
    name: Optional[str] = None
    labels: Optional[Dict[str, str]] = None


def _opt(config: Any, key: str, default: Any) -> Any:
    v = getattr(config, key, None)
    return default if v is None else v


@register_sandbox(SANDBOX_TYPE)
class WarrenSandbox(Sandbox):
    """An ms-enclave sandbox that is a Warren sandbox."""

    def __init__(self, config: SandboxConfig, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        self._lock = asyncio.Lock()
        self._client: Optional[sync.SandboxClient] = None
        self._sandbox: Optional[sync.Sandbox] = None
        self._name = str(_opt(config, "name", f"enclave-{uuid.uuid4().hex[:8]}"))

    @property
    def sandbox_type(self) -> Any:
        return SANDBOX_TYPE

    def _fail(self, what: str, err: BaseException) -> None:
        self.metadata["error"] = f"{what}: {err}"
        self.metadata["error_at"] = time.time()
        self.update_status(SandboxStatus.ERROR)

    async def start(self) -> None:
        async with self._lock:
            if self.status == SandboxStatus.RUNNING:
                return
            try:
                if self._client is None:
                    self._client = sync.SandboxClient(_opt(self.config, "server_url", None),
                                                      _opt(self.config, "api_key", None),
                                                      namespace=_opt(self.config, "namespace", None))
                if self._sandbox is None:
                    spec = SandboxSpec(name=self._name, image=str(_opt(self.config, "image", "python")),
                                       memory_mib=int(_opt(self.config, "memory_mib", 512)),
                                       cpus=int(_opt(self.config, "cpus", 1)),
                                       labels=dict(_opt(self.config, "labels", {})))
                    self._sandbox = await _thread(self._client.create, spec)
                else:  # stopped earlier: start it again, files kept
                    await _thread(self._sandbox.start)
                self.metadata.update(sandbox=self._name, server=self._client.transport.server_url)
                self.metadata.pop("error", None)
                self.update_status(SandboxStatus.RUNNING)
            except Exception as e:
                self._fail("start", e)
                raise
        await self.initialize_tools()

    async def stop(self) -> None:
        async with self._lock:
            if self._sandbox is None or self.status == SandboxStatus.STOPPED:
                return
            try:
                await _thread(self._sandbox.stop)
                self.update_status(SandboxStatus.STOPPED)
            except Exception as e:
                self._fail("stop", e)
                raise

    async def cleanup(self) -> None:
        """Removes the Warren sandbox and closes the connections. Idempotent."""
        async with self._lock:
            client, self._client = self._client, None
            sb, self._sandbox = self._sandbox, None
            if client is None:
                return
            try:
                if sb is not None:
                    await _thread(client.remove, sb.name)
                if self.status != SandboxStatus.ERROR:
                    self.update_status(SandboxStatus.STOPPED)
            except Exception as e:
                self._fail("cleanup", e)
                raise
            finally:
                client.close()

    async def execute_command(
        self,
        command: Union[str, List[str]],
        timeout: Optional[int] = None,
        stream: bool = True,
    ) -> CommandResult:
        """Runs ``command`` (a string through /bin/sh, a list without a shell)
        and returns (exit_code, stdout, stderr); past ``timeout`` seconds the
        exit code is 124, as with coreutils' timeout. ``stream`` is accepted;
        output is returned whole (use warren's Sandbox.stream to stream)."""
        sb = self._sandbox
        if sb is None or self.status != SandboxStatus.RUNNING:
            raise RuntimeError(f"sandbox {self._name} is {getattr(self.status, 'value', self.status)}, not running")
        try:
            if isinstance(command, str):
                d = await _thread(sb.exec_details, "", script=command, timeout=timeout)
            else:
                if not command:
                    raise ValueError("empty command")
                d = await _thread(sb.exec_details, command[0], command[1:], timeout=timeout)
        except (Conflict, NotFound, ServerUnreachable) as e:
            # The sandbox stopped, vanished, or its server did.
            self._fail("execute_command", e)
            raise
        if d.timed_out:
            return 124, d.stdout, d.stderr + "command timed out\n"
        return d.exit_code, d.stdout, d.stderr

    async def get_execution_context(self) -> Any:
        """The warren.sync.Sandbox handle (None before start)."""
        return self._sandbox

    def get_info(self) -> Dict[str, Any]:
        base = super().get_info() if hasattr(super(), "get_info") else {}
        info: Dict[str, Any] = dict(base)
        info.update(
            type=self.sandbox_type, status=self.status, sandbox=self._name,
            server=self._client.transport.server_url if self._client else None,
            image=_opt(self.config, "image", "python"), error=self.metadata.get("error"),
        )
        return info
