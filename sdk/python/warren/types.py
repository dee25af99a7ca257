"""Results beyond the platform's ExecResult: sandbox, file and process
information, REPL runs, metrics, streamed output."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Tuple


def _s(d: Mapping[str, Any], k: str) -> str:
    v = d.get(k)
    return v if isinstance(v, str) else ""


def _i(d: Mapping[str, Any], k: str) -> int:
    v = d.get(k)
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0


def _f(d: Mapping[str, Any], k: str) -> Optional[float]:
    v = d.get(k)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


@dataclass(frozen=True)
class SandboxInfo:
    """``sandbox.get``/``sandbox.list``: a sandbox's record. ``raw`` holds every field sent."""

    name: str
    namespace: str
    state: str
    image: str = ""
    error: str = ""
    memory_mib: int = 0
    cpus: float = 0
    labels: Dict[str, str] = field(default_factory=dict)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_wire(cls, d: Any) -> "SandboxInfo":
        d = d if isinstance(d, dict) else {}
        labels = d.get("labels")
        return cls(
            name=_s(d, "name"), namespace=_s(d, "namespace"), state=_s(d, "state"),
            image=_s(d, "image"), error=_s(d, "error"), memory_mib=_i(d, "memory_mib"),
            cpus=_f(d, "cpus") or 0.0,
            labels={str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {},
            raw=d,
        )


@dataclass(frozen=True)
class ExecDetails:
    """Everything ``sandbox.exec`` reports (``Sandbox.exec_details``)."""

    stdout: str
    stderr: str
    exit_code: int
    signal: str = ""
    timed_out: bool = False
    oom_killed: bool = False
    truncated: bool = False
    duration_ms: float = 0.0
    # The output's bytes as written, with ``binary=True`` (stdout and stderr
    # are then these decoded as UTF-8, invalid bytes replaced).
    stdout_bytes: bytes = b""
    stderr_bytes: bytes = b""


@dataclass(frozen=True)
class FileInfo:
    name: str
    path: str
    size: int
    mode: int
    type: str  # "file", "dir", "symlink" or "other"
    mod_time: str = ""
    target: str = ""

    @property
    def is_dir(self) -> bool:
        return self.type == "dir"

    @classmethod
    def from_wire(cls, d: Any) -> "FileInfo":
        d = d if isinstance(d, dict) else {}
        return cls(name=_s(d, "name"), path=_s(d, "path"), size=_i(d, "size"), mode=_i(d, "mode"),
                   type=_s(d, "type"), mod_time=_s(d, "mod_time"), target=_s(d, "target"))


@dataclass(frozen=True)
class ProcessInfo:
    id: str
    argv: Tuple[str, ...]
    pid: int
    running: bool
    exit_code: Optional[int] = None
    signal: str = ""
    timed_out: bool = False

    @classmethod
    def from_wire(cls, d: Any) -> "ProcessInfo":
        d = d if isinstance(d, dict) else {}
        argv = d.get("argv")
        ex = d.get("exit")
        running = bool(d.get("running"))
        code: Optional[int] = None
        sig = ""
        to = False
        if isinstance(ex, dict) and not running:
            code, sig, to = _i(ex, "code"), _s(ex, "signal"), bool(ex.get("timed_out"))
        return cls(id=_s(d, "id"), argv=tuple(str(a) for a in argv) if isinstance(argv, list) else (),
                   pid=_i(d, "pid"), running=running, exit_code=code, signal=sig, timed_out=to)


@dataclass(frozen=True)
class OutputChunk:
    """``sandbox.process.output``: ``data`` from byte ``offset``; ask next from ``next_offset``."""

    data: bytes
    offset: int
    next_offset: int
    dropped: int
    eof: bool


@dataclass(frozen=True)
class OutputLine:
    stream: str  # "stdout" or "stderr"
    text: str


@dataclass(frozen=True)
class ReplResult:
    """A REPL run (``sandbox.repl.run``): state persists between runs of a sandbox."""

    status: str  # "success", "error", "exception", "timeout"
    language: str
    lines: Tuple[OutputLine, ...]
    # The repr of the last expression's value ("" when there was none).
    result: str = ""
    has_error: bool = False
    truncated: bool = False

    @property
    def stdout(self) -> str:
        return "".join(line.text + "\n" for line in self.lines if line.stream == "stdout")

    @property
    def stderr(self) -> str:
        return "".join(line.text + "\n" for line in self.lines if line.stream == "stderr")

    @classmethod
    def from_wire(cls, d: Any) -> "ReplResult":
        d = d if isinstance(d, dict) else {}
        lines = parse_lines(d.get("output"))
        has_error = d.get("has_error")
        if not isinstance(has_error, bool):
            has_error = _s(d, "status") in ("error", "exception") or any(x.stream == "stderr" for x in lines)
        return cls(status=_s(d, "status"), language=_s(d, "language"), lines=lines,
                   result=_s(d, "result"), has_error=has_error, truncated=bool(d.get("truncated")))


def parse_lines(out: Any) -> Tuple[OutputLine, ...]:
    if not isinstance(out, list):
        return ()
    return tuple(OutputLine(_s(x, "stream"), _s(x, "text")) for x in out if isinstance(x, dict))


@dataclass(frozen=True)
class Metrics:
    """``sandbox.metrics.get`` for one sandbox; None where it could not be measured."""

    name: str
    namespace: str
    running: bool
    paused: bool = False
    cpu_usage: Optional[float] = None  # percent, 100 = one core
    memory_usage: Optional[int] = None  # MiB
    disk_usage: Optional[int] = None  # bytes
    disk_limit: Optional[int] = None  # bytes

    @classmethod
    def from_wire(cls, d: Any) -> "Metrics":
        d = d if isinstance(d, dict) else {}

        def opt_int(k: str) -> Optional[int]:
            v = _f(d, k)
            return None if v is None else int(v)

        return cls(name=_s(d, "name"), namespace=_s(d, "namespace"), running=bool(d.get("running")),
                   paused=bool(d.get("paused")), cpu_usage=_f(d, "cpu_usage"),
                   memory_usage=opt_int("memory_usage"), disk_usage=opt_int("disk_usage"),
                   disk_limit=opt_int("disk_limit"))


@dataclass(frozen=True)
class StreamEvent:
    """One message of a streamed run (``Sandbox.stream``, ``Sandbox.pty``).

    ``kind`` is "started", "stdout", "stderr", "dropped" (``dropped`` bytes of
    ``stream`` were lost before what follows) or "exit" (``exit_code``,
    ``signal``).
    """

    kind: str
    data: bytes = b""
    stream: str = ""
    dropped: int = 0
    exit_code: Optional[int] = None
    signal: str = ""
    pid: int = 0
    id: str = ""
