"""The asynchronous client: the agent platform's SandboxClient over Warren.

Calls run the synchronous client's (warren.sync) in worker threads, so the
event loop never blocks on the network; streaming (``stream``, ``pty``)
speaks the WebSocket natively on the loop.
"""
from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import functools
import json
import threading
import uuid
from typing import Any, AsyncIterator, Callable, Dict, List, Mapping, Optional, ParamSpec, Sequence, TypeVar

from . import base, sync
from ._transport import DEFAULT_TIMEOUT, Transport
from ._ws import WebSocket
from .base import ExecResult, SandboxSpec
from .errors import KIND_CLASSES, ProtocolError, WarrenError
from .types import ExecDetails, FileInfo, Metrics, OutputChunk, ProcessInfo, ReplResult, SandboxInfo, StreamEvent

P = ParamSpec("P")
T = TypeVar("T")


# Calls wait in threads of their own pool: asyncio's default executor has
# only CPUs + 4 threads, so a few long commands would hold up every other
# call. Threads are made as calls need them, up to MAX_CONCURRENT_CALLS.
MAX_CONCURRENT_CALLS = 256
_executor: Optional[concurrent.futures.ThreadPoolExecutor] = None
_executor_lock = threading.Lock()


def _pool() -> concurrent.futures.ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = concurrent.futures.ThreadPoolExecutor(MAX_CONCURRENT_CALLS, thread_name_prefix="warren")
        return _executor


async def _thread(f: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    return await asyncio.get_running_loop().run_in_executor(_pool(), functools.partial(f, *args, **kwargs))


class SandboxClient(base.SandboxClient):
    """A Warren server (async). Arguments as :class:`warren.sync.SandboxClient`."""

    def __init__(
        self,
        server_url: Optional[str] = None,
        api_key: Optional[str] = None,
        *,
        namespace: Optional[str] = None,
        timeout: float = DEFAULT_TIMEOUT,
        retries: int = 2,
        pool_size: int = 8,
        transport: Optional[Transport] = None,
    ) -> None:
        self.sync = sync.SandboxClient(server_url, api_key, namespace=namespace, timeout=timeout,
                                       retries=retries, pool_size=pool_size, transport=transport)

    async def __aenter__(self) -> "SandboxClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sync.close()

    async def call(self, method: str, params: Mapping[str, Any], *, timeout: Optional[float] = None,
                   idempotent: bool = False) -> Any:
        return await _thread(self.sync.call, method, params, timeout=timeout, idempotent=idempotent)

    async def health(self) -> None:
        await _thread(self.sync.health)

    async def create(self, spec: SandboxSpec, **kwargs: Any) -> "Sandbox":
        """``sandbox.create``; ``kwargs`` as warren.sync.SandboxClient.create (env, workdir, ...)."""
        return Sandbox(self, await _thread(self.sync.create, spec, **kwargs))

    async def get(self, name: str) -> "Sandbox":
        return Sandbox(self, await _thread(self.sync.get, name))

    def sandbox(self, name: str) -> "Sandbox":
        return Sandbox(self, self.sync.sandbox(name))

    async def list(self) -> List[str]:
        return await _thread(self.sync.list)

    async def list_info(self, *, state: Optional[str] = None,
                        labels: Optional[Mapping[str, str]] = None) -> List[SandboxInfo]:
        return await _thread(self.sync.list_info, state=state, labels=labels)

    async def remove(self, name: str) -> None:
        await _thread(self.sync.remove, name)

    async def metrics(self, name: Optional[str] = None) -> List[Metrics]:
        return await _thread(self.sync.metrics, name)

    async def run_python(self, code: str, *, image: str = "python:3.11-slim", timeout: Optional[float] = None,
                         **kwargs: Any) -> ExecResult:
        """Creates a sandbox, runs ``python -c code``, stops and removes it,
        even when cancelled: cancellation removes the sandbox at once (ending
        the run), and the call returns only after that."""
        return await self._one_shot_threaded("py-", image, kwargs, lambda sb: sb.exec("python", ["-c", code], timeout=timeout))

    async def run_shell(self, script: str, *, image: str = "python:3.11-slim", timeout: Optional[float] = None,
                        **kwargs: Any) -> ExecResult:
        """As run_python, for a /bin/sh script."""
        return await self._one_shot_threaded("sh-", image, kwargs, lambda sb: sb.shell(script, timeout=timeout))

    async def _one_shot_threaded(
        self, prefix: str, image: str, kwargs: Dict[str, Any], run: Callable[[sync.Sandbox], ExecResult],
    ) -> ExecResult:
        name = f"{prefix}{uuid.uuid4().hex[:8]}"
        cancel = threading.Event()
        task = asyncio.ensure_future(_thread(self.sync.one_shot, prefix, image, kwargs, run, cancel, name))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            # The worker thread cannot be interrupted: removing the sandbox
            # ends its command (or the create it waits for is checked
            # afterwards), and its own finally removes the sandbox again.
            cancel.set()
            await asyncio.shield(_thread(self.sync._cleanup, name))
            try:
                await asyncio.shield(task)
            except BaseException:  # noqa: BLE001 - the run's outcome is moot now
                pass
            raise


class Sandbox(base.SandboxHandle):
    """A sandbox (async): the platform's handle plus files, processes, REPL,
    metrics, streaming and terminals."""

    def __init__(self, client: SandboxClient, s: sync.Sandbox) -> None:
        self.client = client
        self.sync = s
        self.name = s.name

    def __repr__(self) -> str:
        return f"Sandbox({self.name!r})"

    async def info(self) -> SandboxInfo:
        return await _thread(self.sync.info)

    async def start(self) -> None:
        await _thread(self.sync.start)

    async def stop(self) -> None:
        await _thread(self.sync.stop)

    async def kill(self) -> None:
        await _thread(self.sync.kill)

    async def pause(self) -> None:
        await _thread(self.sync.pause)

    async def resume(self) -> None:
        await _thread(self.sync.resume)

    async def logs(self, *, tail: Optional[int] = None) -> str:
        return await _thread(self.sync.logs, tail=tail)

    async def metrics(self) -> Metrics:
        return await _thread(self.sync.metrics)

    async def exec(self, cmd: str, args: Optional[Sequence[str]] = None, *, timeout: Optional[float] = None,
                   **kw: Any) -> ExecResult:
        """``[cmd, *args]`` without a shell; ``kw``: stdin, env, cwd, user, output_limit."""
        return await _thread(self.sync.exec, cmd, args, timeout=timeout, **kw)

    async def exec_details(self, cmd: str, args: Optional[Sequence[str]] = None, **kw: Any) -> ExecDetails:
        return await _thread(self.sync.exec_details, cmd, args, **kw)

    async def shell(self, script: str, *, timeout: Optional[float] = None, **kw: Any) -> ExecResult:
        return await _thread(self.sync.shell, script, timeout=timeout, **kw)

    async def repl(self, code: str, *, language: str = "python", timeout: Optional[float] = None) -> ReplResult:
        return await _thread(self.sync.repl, code, language=language, timeout=timeout)

    async def read_file(self, path: str) -> bytes:
        return await _thread(self.sync.read_file, path)

    async def write_file(self, path: str, data: bytes | str, *, mode: int = 0o644) -> None:
        await _thread(self.sync.write_file, path, data, mode=mode)

    async def list_files(self, path: str) -> List[FileInfo]:
        return await _thread(self.sync.list_files, path)

    async def stat(self, path: str) -> FileInfo:
        return await _thread(self.sync.stat, path)

    async def mkdir(self, path: str, *, parents: bool = False, mode: int = 0o755) -> None:
        await _thread(self.sync.mkdir, path, parents=parents, mode=mode)

    async def remove_file(self, path: str, *, recursive: bool = False) -> None:
        await _thread(self.sync.remove_file, path, recursive=recursive)

    async def move(self, src: str, dst: str) -> None:
        await _thread(self.sync.move, src, dst)

    async def upload_dir(self, local_dir: str, dest: str) -> None:
        await _thread(self.sync.upload_dir, local_dir, dest)

    async def download_dir(self, path: str, local_dir: str) -> None:
        await _thread(self.sync.download_dir, path, local_dir)

    async def upload_tar(self, data: bytes, dest: str) -> None:
        await _thread(self.sync.upload_tar, data, dest)

    async def download_tar(self, path: str) -> bytes:
        return await _thread(self.sync.download_tar, path)

    async def start_process(self, cmd: str, args: Optional[Sequence[str]] = None, **kw: Any) -> "Process":
        """A background process; ``kw``: env, cwd, user, stdin, tty, rows, cols."""
        return Process(await _thread(self.sync.start_process, cmd, args, **kw))

    async def processes(self) -> List[ProcessInfo]:
        return await _thread(self.sync.processes)

    def process(self, pid: str) -> "Process":
        return Process(self.sync.process(pid))

    async def stream(self, cmd: str, args: Optional[Sequence[str]] = None, *, env: Optional[Sequence[str]] = None,
                     cwd: str = "", user: str = "") -> AsyncIterator[StreamEvent]:
        """Runs ``[cmd, *args]`` and yields its output as it is produced,
        ending with an "exit" event. Leaving the loop early kills the process."""
        async with await self._session([cmd, *(args or [])], env=env, cwd=cwd, user=user, tty=False) as s:
            async for ev in s:
                yield ev

    async def pty(self, cmd: str = "/bin/sh", args: Optional[Sequence[str]] = None, *, rows: int = 24,
                  cols: int = 80, env: Optional[Sequence[str]] = None, cwd: str = "", user: str = "") -> "Session":
        """An interactive terminal: ``async with await sb.pty() as t``; write
        with ``t.send``, read ``async for ev in t`` (output arrives as stdout)."""
        return await self._session([cmd, *(args or [])], env=env, cwd=cwd, user=user, tty=True, rows=rows, cols=cols)

    async def _session(self, argv: List[str], *, env: Optional[Sequence[str]], cwd: str, user: str, tty: bool,
                       rows: int = 24, cols: int = 80) -> "Session":
        return await open_session(self.sync, argv, env=env, cwd=cwd, user=user, tty=tty, rows=rows, cols=cols)


async def open_session(sb: sync.Sandbox, argv: List[str], *, env: Optional[Sequence[str]] = None, cwd: str = "",
                       user: str = "", tty: bool = False, rows: int = 24, cols: int = 80) -> "Session":
    """Starts ``argv`` in ``sb`` over the WebSocket."""
    t = sb.client.transport
    q = {"sandbox": sb.name}
    if sb.client.namespace:
        q["namespace"] = sb.client.namespace
    ws = await WebSocket.connect(t, t.path("/api/v1/ws", q), timeout=t.timeout)
    start: Dict[str, Any] = {"argv": argv, "env": list(env or []), "cwd": cwd, "user": user, "tty": tty}
    if tty:
        start["rows"], start["cols"] = rows, cols
    try:
        await ws.send_json(start)
    except BaseException:
        await ws.close()
        raise
    return Session(ws)


class Session:
    """A process over the WebSocket: iterate for its events; send input,
    resizes and signals. Closing the session kills the process."""

    def __init__(self, ws: WebSocket) -> None:
        self._ws = ws
        self.done = False

    async def __aenter__(self) -> "Session":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._ws.close()

    def __aiter__(self) -> "Session":
        return self

    async def __anext__(self) -> StreamEvent:
        if self.done:
            raise StopAsyncIteration
        raw = await self._ws.recv()
        if raw is None:
            self.done = True
            raise ProtocolError("the WebSocket closed before the process's exit was reported")
        try:
            m = json.loads(raw)
        except ValueError as e:
            raise ProtocolError(f"WebSocket message is not JSON: {raw[:100]!r}") from e
        if not isinstance(m, dict):
            raise ProtocolError("WebSocket message is not an object")
        kind = m.get("type")
        if kind in ("stdout", "stderr"):
            data = m.get("data")
            return StreamEvent(kind=kind, stream=kind, data=base64.b64decode(data) if isinstance(data, str) else b"")
        if kind == "started":
            pid = m.get("pid")
            return StreamEvent(kind="started", id=str(m.get("id") or ""), pid=pid if isinstance(pid, int) else 0)
        if kind == "dropped":
            n = m.get("dropped")
            return StreamEvent(kind="dropped", stream=str(m.get("stream") or ""), dropped=n if isinstance(n, int) else 0)
        if kind == "exit":
            self.done = True
            ex = m.get("exit")
            ex = ex if isinstance(ex, dict) else {}
            code = ex.get("code")
            return StreamEvent(kind="exit", exit_code=code if isinstance(code, int) else -1,
                               signal=str(ex.get("signal") or ""))
        if kind == "error":
            self.done = True
            k = str(m.get("kind") or "")
            raise KIND_CLASSES.get(k, WarrenError)(str(m.get("message") or "WebSocket error"), kind=k)
        raise ProtocolError(f"unknown WebSocket message type {kind!r}")

    async def send(self, data: bytes | str) -> None:
        """Writes to the process's stdin (≤ 768 KiB per call: the server takes 1 MiB messages)."""
        raw = data.encode() if isinstance(data, str) else data
        for i in range(0, len(raw), 768 << 10):
            await self._ws.send_json({"type": "stdin", "data": base64.b64encode(raw[i:i + (768 << 10)]).decode()})

    async def eof(self) -> None:
        await self._ws.send_json({"type": "eof"})

    async def resize(self, rows: int, cols: int) -> None:
        await self._ws.send_json({"type": "resize", "rows": rows, "cols": cols})

    async def signal(self, sig: str) -> None:
        await self._ws.send_json({"type": "signal", "signal": sig})


class Process:
    """A background process (async)."""

    def __init__(self, p: sync.Process) -> None:
        self.sync = p
        self.id = p.id

    async def info(self) -> ProcessInfo:
        return await _thread(self.sync.info)

    async def output(self, *, stream: str = "stdout", offset: int = 0, wait: float = 0) -> OutputChunk:
        return await _thread(self.sync.output, stream=stream, offset=offset, wait=wait)

    async def wait(self, timeout: float = 300) -> ProcessInfo:
        return await _thread(self.sync.wait, timeout)

    async def signal(self, sig: str = "SIGTERM") -> None:
        await _thread(self.sync.signal, sig)

    async def write_stdin(self, text: str, *, close: bool = False) -> None:
        await _thread(self.sync.write_stdin, text, close=close)

    async def resize(self, rows: int, cols: int) -> None:
        await _thread(self.sync.resize, rows, cols)

    async def remove(self) -> None:
        await _thread(self.sync.remove)
