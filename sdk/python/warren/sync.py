"""The synchronous client: every call blocks the calling thread. The
asynchronous :class:`warren.SandboxClient` runs these same calls in worker
threads, so both behave alike. Safe to share between threads."""
from __future__ import annotations

import base64
import io
import os
import threading
import uuid
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence

from .base import ExecResult, SandboxSpec
from .errors import Conflict, InvalidParams, WarrenError
from ._transport import DEFAULT_TIMEOUT, Transport, decode_answer
from .types import ExecDetails, FileInfo, Metrics, OutputChunk, ProcessInfo, ReplResult, SandboxInfo, StreamEvent

if TYPE_CHECKING:  # tarfile is imported where used: it costs import time
    import tarfile

# The longest a command may run (the server's maximum timeout), so the
# longest a call that waits for one may wait, plus slack for the answer.
MAX_RUN = 86400.0
_SLACK = 30.0
# Bounds the stop and remove of a one-shot run.
CLEANUP_TIMEOUT = 30.0
# A tar download held in memory or written to disk, at most.
MAX_TAR = 1 << 30


def _run_wait(timeout: Optional[float]) -> float:
    return (timeout if timeout else MAX_RUN) + _SLACK


class SandboxClient:
    """A Warren server. ``server_url`` and ``api_key`` default to
    ``MSB_SERVER_URL`` (else http://127.0.0.1:5555) and ``MSB_API_KEY``;
    ``namespace`` to the key's own (or ``default``). ``timeout`` bounds every
    call that does not wait for a command."""

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
        self.transport = transport or Transport(server_url, api_key, timeout=timeout, retries=retries, pool_size=pool_size)
        self.namespace = namespace

    def __enter__(self) -> "SandboxClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.transport.close()

    def call(self, method: str, params: Mapping[str, Any], *, timeout: Optional[float] = None,
             idempotent: bool = False) -> Any:
        """Any JSON-RPC method of docs/api.md; ``namespace`` is added when the client has one."""
        p = dict(params)
        if self.namespace and "namespace" not in p:
            p["namespace"] = self.namespace
        return self.transport.call(method, p, timeout=timeout, idempotent=idempotent)

    def health(self) -> None:
        """Raises unless the server answers its health check."""
        status, _, data = self.transport.request("GET", self.transport.path("/api/v1/health"), idempotent=True)
        if status != 200:
            decode_answer("health", status, data)

    # -- sandboxes ------------------------------------------------------------

    def create(
        self,
        spec: SandboxSpec,
        *,
        env: Optional[Sequence[str]] = None,
        workdir: Optional[str] = None,
        idle_timeout: Optional[float] = None,
        max_lifetime: Optional[float] = None,
        disk_mib: Optional[int] = None,
        ports: Optional[Sequence[str]] = None,
        volumes: Optional[Sequence[str]] = None,
        idle_action: Optional[str] = None,
    ) -> "Sandbox":
        """Creates and starts a sandbox (``sandbox.create``). Every field of
        ``spec`` is sent; empty ``secrets``/``egress`` and no ``workspace``
        are left out (the server's default: no secrets, nothing leaves)."""
        p: Dict[str, Any] = {"name": spec.name, "image": spec.image, "memory_mib": spec.memory_mib, "cpus": spec.cpus}
        if spec.workspace is not None:
            p["workspace"] = spec.workspace
        if spec.secrets:
            p["secrets"] = list(spec.secrets)
        if spec.egress:
            p["egress"] = list(spec.egress)
        if spec.labels:
            p["labels"] = dict(spec.labels)
        for k, v in (("env", env), ("ports", ports), ("volumes", volumes)):
            if v is not None:
                p[k] = list(v)
        for k, w in (("workdir", workdir), ("idle_timeout", idle_timeout), ("max_lifetime", max_lifetime),
                     ("disk_mib", disk_mib), ("idle_action", idle_action)):
            if w is not None:
                p[k] = w
        # A start waits for an image pull and the sandbox's boot.
        self.call("sandbox.create", p, timeout=max(self.transport.timeout, 600.0))
        return Sandbox(self, spec.name)

    def sandbox(self, name: str) -> "Sandbox":
        """The handle of ``name``, without asking the server."""
        return Sandbox(self, name)

    def get(self, name: str) -> "Sandbox":
        """The handle of an existing sandbox; NotFound when there is none."""
        sb = Sandbox(self, name)
        sb.info()
        return sb

    def list_info(self, *, state: Optional[str] = None, labels: Optional[Mapping[str, str]] = None) -> List[SandboxInfo]:
        p: Dict[str, Any] = {}
        if state:
            p["state"] = state
        if labels:
            p["labels"] = dict(labels)
        res = self.call("sandbox.list", p, idempotent=True)
        items = res.get("sandboxes") if isinstance(res, dict) else None
        return [SandboxInfo.from_wire(x) for x in items or []]

    def list(self) -> List[str]:
        """Names of the namespace's sandboxes."""
        return [i.name for i in self.list_info()]

    def remove(self, name: str) -> None:
        """Stops and removes ``name``; no error when it does not exist."""
        self.call("sandbox.remove", {"sandbox": name}, idempotent=True)

    def metrics(self, name: Optional[str] = None) -> List[Metrics]:
        p: Dict[str, Any] = {"sandbox": name} if name else {}
        res = self.call("sandbox.metrics.get", p, idempotent=True)
        items = res.get("sandboxes") if isinstance(res, dict) else None
        return [Metrics.from_wire(x) for x in items or []]

    # -- one-shot runs ----------------------------------------------------------

    def run_python(self, code: str, *, image: str = "python:3.11-slim", timeout: Optional[float] = None,
                   **kwargs: Any) -> ExecResult:
        """Creates a sandbox ``py-XXXXXXXX``, runs ``python -c code``, then stops
        and removes it, whatever happened. ``kwargs``: more SandboxSpec fields."""
        return self.one_shot("py-", image, kwargs, lambda sb: sb.exec("python", ["-c", code], timeout=timeout))

    def run_shell(self, script: str, *, image: str = "python:3.11-slim", timeout: Optional[float] = None,
                  **kwargs: Any) -> ExecResult:
        """As run_python, for a /bin/sh script (sandbox ``sh-XXXXXXXX``)."""
        return self.one_shot("sh-", image, kwargs, lambda sb: sb.shell(script, timeout=timeout))

    def one_shot(
        self,
        prefix: str,
        image: str,
        spec_fields: Mapping[str, Any],
        run: Callable[["Sandbox"], ExecResult],
        cancel: Optional[threading.Event] = None,
        name: Optional[str] = None,
    ) -> ExecResult:
        spec = SandboxSpec(name=name or f"{prefix}{uuid.uuid4().hex[:8]}", image=image, **spec_fields)
        try:
            sb = self.create(spec)
        except Conflict:
            raise  # the name was someone else's: leave it
        except BaseException:
            # A failed create may still have left a record (a start that
            # failed on the host is kept in state error): remove the name.
            self._cleanup(spec.name)
            raise
        try:
            if cancel is not None and cancel.is_set():
                raise WarrenError(f"one-shot run in {spec.name} cancelled")
            return run(sb)
        finally:
            self._cleanup(spec.name)

    def _cleanup(self, name: str) -> None:
        # sandbox.remove stops a running sandbox itself; errors are dropped
        # (the run's outcome matters more; the idle timeout reclaims the rest).
        try:
            self.transport.call("sandbox.remove", self._ns({"sandbox": name}), timeout=CLEANUP_TIMEOUT, idempotent=True)
        except Exception:  # noqa: BLE001
            pass

    def _ns(self, p: Dict[str, Any]) -> Dict[str, Any]:
        if self.namespace:
            p["namespace"] = self.namespace
        return p


class Sandbox:
    """A sandbox of a :class:`SandboxClient` (sync)."""

    def __init__(self, client: SandboxClient, name: str) -> None:
        self.client = client
        self.name = name

    def __repr__(self) -> str:
        return f"Sandbox({self.name!r})"

    def _call(self, method: str, p: Optional[Dict[str, Any]] = None, **kw: Any) -> Any:
        params = {"sandbox": self.name}
        params.update(p or {})
        return self.client.call(method, params, **kw)

    # -- lifecycle ------------------------------------------------------------

    def info(self) -> SandboxInfo:
        return SandboxInfo.from_wire(self._call("sandbox.get", idempotent=True))

    def start(self) -> None:
        """Starts a stopped sandbox again, with its files (``sandbox.start``)."""
        self._call("sandbox.start", timeout=max(self.client.transport.timeout, 600.0))

    def stop(self) -> None:
        self._call("sandbox.stop", idempotent=True)

    def kill(self) -> None:
        """Warren's stop is already immediate (SIGKILL to every process): as stop."""
        self.stop()

    def pause(self) -> None:
        self._call("sandbox.pause", idempotent=True)

    def resume(self) -> None:
        self._call("sandbox.resume", idempotent=True)

    def logs(self, *, tail: Optional[int] = None) -> str:
        res = self._call("sandbox.logs", {"tail": tail} if tail else {}, idempotent=True)
        lines = res.get("lines") if isinstance(res, dict) else None
        return "".join(str(x) + "\n" for x in lines or [])

    def metrics(self) -> Metrics:
        res = self.client.metrics(self.name)
        if not res:
            raise WarrenError(f"sandbox.metrics.get answered nothing for {self.name}")
        return res[0]

    # -- running commands -----------------------------------------------------

    def exec_details(
        self,
        cmd: str,
        args: Optional[Sequence[str]] = None,
        *,
        script: Optional[str] = None,
        timeout: Optional[float] = None,
        stdin: Optional[str] = None,
        env: Optional[Sequence[str]] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        output_limit: Optional[int] = None,
        binary: bool = False,
    ) -> ExecDetails:
        """``sandbox.exec`` of ``[cmd, *args]`` (no shell), or ``sandbox.shell``
        of ``script`` when given (``cmd`` is then ignored). A command past its
        timeout is a result (``timed_out``), not an error. ``binary`` returns
        the output's bytes too (``stdout_bytes``, ``stderr_bytes``)."""
        p: Dict[str, Any] = {}
        if script is not None:
            method = "sandbox.shell"
            p["script"] = script
        else:
            method = "sandbox.exec"
            p["argv"] = [cmd, *(args or [])]
        if timeout:
            p["timeout"] = timeout
        if stdin is not None:
            p["stdin"] = stdin
        if env:
            p["env"] = list(env)
        if cwd:
            p["cwd"] = cwd
        if user:
            p["user"] = user
        if output_limit:
            p["output_limit"] = output_limit
        if binary:
            p["binary"] = True
        r = self._call(method, p, timeout=_run_wait(timeout))
        r = r if isinstance(r, dict) else {}
        code = r.get("exit_code")
        dur = r.get("duration_ms")
        out, err = str(r.get("stdout") or ""), str(r.get("stderr") or "")
        raw_out = raw_err = b""
        if binary:
            raw_out, raw_err = base64.b64decode(out), base64.b64decode(err)
            out, err = raw_out.decode("utf-8", "replace"), raw_err.decode("utf-8", "replace")
        return ExecDetails(
            stdout=out, stderr=err, stdout_bytes=raw_out, stderr_bytes=raw_err,
            exit_code=code if isinstance(code, int) else -1, signal=str(r.get("signal") or ""),
            timed_out=bool(r.get("timed_out")), oom_killed=bool(r.get("oom_killed")),
            truncated=bool(r.get("truncated")), duration_ms=float(dur) if isinstance(dur, (int, float)) else 0.0,
        )

    def exec(self, cmd: str, args: Optional[Sequence[str]] = None, *, timeout: Optional[float] = None,
             **kw: Any) -> ExecResult:
        """Runs ``cmd`` with ``args`` directly (no shell). ``kw``: stdin, env, cwd, user, output_limit."""
        return _result(self.exec_details(cmd, args, timeout=timeout, **kw))

    def shell(self, script: str, *, timeout: Optional[float] = None, **kw: Any) -> ExecResult:
        """Runs ``script`` with /bin/sh -c."""
        return _result(self.exec_details("", script=script, timeout=timeout, **kw))

    def repl(self, code: str, *, language: str = "python", timeout: Optional[float] = None) -> ReplResult:
        """Runs ``code`` in the sandbox's interpreter (state persists between
        runs); ``result`` is the repr of the last expression's value."""
        p: Dict[str, Any] = {"language": language, "code": code}
        if timeout:
            p["timeout"] = timeout
        return ReplResult.from_wire(self._call("sandbox.repl.run", p, timeout=_run_wait(timeout) + _SLACK))

    # -- files ------------------------------------------------------------------

    def read_file(self, path: str) -> bytes:
        res = self._call("sandbox.file.read", {"path": path}, idempotent=True)
        data = res.get("data") if isinstance(res, dict) else None
        if not isinstance(data, str):
            raise WarrenError(f"sandbox.file.read {path}: no data in the answer")
        return base64.b64decode(data)

    def write_file(self, path: str, data: bytes | str, *, mode: int = 0o644) -> None:
        raw = data.encode() if isinstance(data, str) else data
        self._call("sandbox.file.write", {"path": path, "data": base64.b64encode(raw).decode(), "mode": mode})

    def list_files(self, path: str) -> List[FileInfo]:
        res = self._call("sandbox.file.list", {"path": path}, idempotent=True)
        items = res.get("entries") if isinstance(res, dict) else None
        return [FileInfo.from_wire(x) for x in items or []]

    def stat(self, path: str) -> FileInfo:
        return FileInfo.from_wire(self._call("sandbox.file.stat", {"path": path}, idempotent=True))

    def mkdir(self, path: str, *, parents: bool = False, mode: int = 0o755) -> None:
        self._call("sandbox.file.mkdir", {"path": path, "parents": parents, "mode": mode}, idempotent=parents)

    def remove_file(self, path: str, *, recursive: bool = False) -> None:
        self._call("sandbox.file.remove", {"path": path, "recursive": recursive})

    def move(self, src: str, dst: str) -> None:
        self._call("sandbox.file.move", {"from": src, "to": dst})

    def _tar_path(self, path: str) -> str:
        ns = self.client.namespace or "-"
        return self.client.transport.path(f"/api/v1/sandboxes/{ns}/{self.name}/tar", {"path": path})

    def upload_tar(self, data: bytes, dest: str) -> None:
        """Unpacks the tar archive ``data`` under directory ``dest`` (≤ 1 GiB)."""
        status, _, body = self.client.transport.request(
            "PUT", self._tar_path(dest), data, headers={"Content-Type": "application/x-tar"},
            timeout=max(self.client.transport.timeout, 600.0))
        if status != 200:
            decode_answer(f"tar upload to {dest}", status, body)

    def download_tar(self, path: str, *, limit: int = MAX_TAR) -> bytes:
        """A tar archive of ``path`` (a file or a directory), at most ``limit`` bytes."""
        buf = io.BytesIO()
        status, _, body = self.client.transport.request(
            "GET", self._tar_path(path), sink=buf, limit=limit, idempotent=True,
            timeout=max(self.client.transport.timeout, 600.0))
        if status != 200:
            decode_answer(f"tar download of {path}", status, body)
        return buf.getvalue()

    def upload_dir(self, local_dir: str, dest: str) -> None:
        """Copies the local directory's contents under ``dest`` in the sandbox."""
        if not os.path.isdir(local_dir):
            raise InvalidParams(f"{local_dir} is not a directory", kind="invalid_params")
        import tarfile

        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
            for entry in sorted(os.listdir(local_dir)):
                tf.add(os.path.join(local_dir, entry), arcname=entry)
        self.upload_tar(buf.getvalue(), dest)

    def download_dir(self, path: str, local_dir: str, *, limit: int = MAX_TAR) -> None:
        """Copies what is in directory ``path`` of the sandbox into ``local_dir``
        (as upload_dir, the other way). The archive is
        hostile input: members that would leave ``local_dir`` (absolute
        paths, ``..``, links out, devices) are refused."""
        import tarfile

        data = self.download_tar(path, limit=limit)
        os.makedirs(local_dir, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf:
            _safe_extract(tf, local_dir)

    # -- background processes -----------------------------------------------------

    def start_process(
        self,
        cmd: str,
        args: Optional[Sequence[str]] = None,
        *,
        env: Optional[Sequence[str]] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        stdin: Optional[str] = None,
        tty: bool = False,
        rows: int = 0,
        cols: int = 0,
    ) -> "Process":
        p: Dict[str, Any] = {"argv": [cmd, *(args or [])]}
        for k, v in (("cwd", cwd), ("user", user), ("stdin", stdin)):
            if v is not None:
                p[k] = v
        if env:
            p["env"] = list(env)
        if tty:
            p["tty"] = True
            if rows and cols:
                p["rows"], p["cols"] = rows, cols
        info = ProcessInfo.from_wire(self._call("sandbox.process.start", p))
        return Process(self, info.id)

    def processes(self) -> List[ProcessInfo]:
        res = self._call("sandbox.process.list", idempotent=True)
        items = res.get("processes") if isinstance(res, dict) else None
        return [ProcessInfo.from_wire(x) for x in items or []]

    def process(self, pid: str) -> "Process":
        """The handle of process ``pid`` (an id such as "p3"), without asking."""
        return Process(self, pid)

    def stream(self, cmd: str, args: Optional[Sequence[str]] = None, *, env: Optional[Sequence[str]] = None,
               cwd: str = "", user: str = "") -> Iterator[StreamEvent]:
        """As the async Sandbox.stream, for a thread without a running event
        loop: yields the run's events as they come, ending with "exit".
        Leaving the loop early kills the process."""
        import asyncio

        from .client import open_session

        loop = asyncio.new_event_loop()
        try:
            session = loop.run_until_complete(open_session(self, [cmd, *(args or [])], env=env, cwd=cwd, user=user))
            try:
                while True:
                    try:
                        yield loop.run_until_complete(session.__anext__())
                    except StopAsyncIteration:
                        return
            finally:
                loop.run_until_complete(session.close())
        finally:
            loop.close()


class Process:
    """A background process; it lives until it exits or the sandbox stops."""

    def __init__(self, sandbox: Sandbox, pid: str) -> None:
        self.sandbox = sandbox
        self.id = pid

    def __repr__(self) -> str:
        return f"Process({self.sandbox.name!r}, {self.id!r})"

    def _call(self, method: str, p: Optional[Dict[str, Any]] = None, **kw: Any) -> Any:
        params: Dict[str, Any] = {"id": self.id}
        params.update(p or {})
        return self.sandbox._call(method, params, **kw)

    def info(self) -> ProcessInfo:
        return ProcessInfo.from_wire(self._call("sandbox.process.get", idempotent=True))

    def output(self, *, stream: str = "stdout", offset: int = 0, wait: float = 0) -> OutputChunk:
        """Output from byte ``offset``; ``wait`` (≤ 60 s) waits for some past it."""
        p: Dict[str, Any] = {"stream": stream, "offset": offset, "binary": True}
        if wait:
            p["wait"] = wait
        r = self._call("sandbox.process.output", p, idempotent=True, timeout=self.sandbox.client.transport.timeout + wait)
        r = r if isinstance(r, dict) else {}
        data = r.get("data")

        def num(k: str) -> int:
            v = r.get(k)
            return v if isinstance(v, int) else 0

        return OutputChunk(data=base64.b64decode(data) if isinstance(data, str) else b"", offset=num("offset"),
                           next_offset=num("next_offset"), dropped=num("dropped"), eof=bool(r.get("eof")))

    def wait(self, timeout: float = 300) -> ProcessInfo:
        """Waits up to ``timeout`` seconds (≤ 300) for the process to exit."""
        return ProcessInfo.from_wire(self._call("sandbox.process.wait", {"timeout": timeout}, idempotent=True,
                                                timeout=timeout + _SLACK))

    def signal(self, sig: str = "SIGTERM") -> None:
        self._call("sandbox.process.signal", {"signal": sig})

    def write_stdin(self, text: str, *, close: bool = False) -> None:
        self._call("sandbox.process.stdin", {"data": text, "close": close})

    def resize(self, rows: int, cols: int) -> None:
        self._call("sandbox.process.resize", {"rows": rows, "cols": cols})

    def remove(self) -> None:
        """Forgets the process (killing it if it runs)."""
        self._call("sandbox.process.remove")


def _result(d: ExecDetails) -> ExecResult:
    return ExecResult(stdout=d.stdout, stderr=d.stderr, exit_code=d.exit_code, truncated=d.truncated)


def _safe_extract(tf: tarfile.TarFile, dest: str) -> None:
    import tarfile

    root = os.path.realpath(dest)
    for m in tf.getmembers():
        target = os.path.realpath(os.path.join(root, m.name))
        if os.path.isabs(m.name) or not (target == root or target.startswith(root + os.sep)):
            raise InvalidParams(f"tar member {m.name!r} would leave {dest}", kind="invalid_params")
        if not (m.isreg() or m.isdir() or m.issym() or m.islnk()):
            raise InvalidParams(f"tar member {m.name!r} is a device or fifo", kind="invalid_params")
        if m.issym() or m.islnk():
            base = root if m.islnk() else os.path.dirname(target)
            link = os.path.realpath(os.path.join(base, m.linkname))
            if os.path.isabs(m.linkname) or not (link == root or link.startswith(root + os.sep)):
                raise InvalidParams(f"tar member {m.name!r} links out of {dest}", kind="invalid_params")
    # Python's own "data" filter where it has one (3.11.4+); else the checks
    # above are the filter.
    extra: Dict[str, Any] = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
    tf.extractall(root, **extra)
