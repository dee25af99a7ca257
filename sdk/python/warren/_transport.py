"""The HTTP transport: pooled keep-alive connections, a timeout on every
call, retries only for idempotent calls, errors by the server's kind.

Invariants:
- Every socket operation has a timeout (connect, send, each read); a call
  that waits for a command adds the command's own timeout to it.
- A call is sent again only when it is idempotent (reads, stop, remove)
  and failed to connect, broke before an answer, or was answered
  ``unavailable``. Anything else might run twice, so it is never resent.
- An idle pooled connection the server has closed is noticed before reuse
  (it reads as ready: EOF), so a non-idempotent call is not lost on it.
- Answers are read whole only up to ``max_answer`` bytes.
- The API key goes only into the Authorization header: never into an
  error message or a repr.
"""
from __future__ import annotations

import http.client
import itertools
import json
import os
import select
import socket
import threading
import time
from typing import IO, Any, Dict, List, Mapping, Optional, Tuple
from urllib.parse import quote, urlsplit

from .errors import ServerUnreachable, TooLarge, Unavailable, WarrenError, from_answer

DEFAULT_URL = "http://127.0.0.1:5555"
DEFAULT_TIMEOUT = 60.0
# Answers held in memory (JSON-RPC results, tar downloads into memory).
DEFAULT_MAX_ANSWER = 256 << 20
_RETRY_BACKOFF = (0.1, 0.4, 1.0)
_CHUNK = 1 << 16


class Transport:
    """One server: a pool of HTTP/1.1 connections shared by threads."""

    def __init__(
        self,
        server_url: Optional[str] = None,
        api_key: Optional[str] = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        retries: int = 2,
        pool_size: int = 8,
        max_answer: int = DEFAULT_MAX_ANSWER,
    ) -> None:
        url = server_url or os.environ.get("MSB_SERVER_URL") or DEFAULT_URL
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"server URL {url!r}: want http://HOST[:PORT] or https://HOST[:PORT]")
        self.server_url = url.rstrip("/")
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.base_path = parts.path.rstrip("/")
        key = api_key if api_key is not None else os.environ.get("MSB_API_KEY")
        self._auth = f"Bearer {key}" if key else ""
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        self.timeout = timeout
        self.retries = max(0, min(retries, len(_RETRY_BACKOFF)))
        self.pool_size = pool_size
        self.max_answer = max_answer
        self._idle: List[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._closed = False

    def __repr__(self) -> str:
        return f"Transport({self.server_url!r}, key={'set' if self._auth else 'none'})"

    @property
    def authorization(self) -> str:
        return self._auth

    # -- connections --------------------------------------------------------

    def _new_conn(self, timeout: float) -> http.client.HTTPConnection:
        if self.scheme == "https":
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def _get_conn(self, timeout: float) -> Tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            while self._idle:
                conn = self._idle.pop()
                sock = conn.sock
                if sock is None:
                    continue
                try:
                    ready, _, _ = select.select([sock], [], [], 0)
                except (OSError, ValueError):
                    ready = [sock]
                if ready:  # closed by the server (or stray bytes): unusable
                    conn.close()
                    continue
                sock.settimeout(timeout)
                conn.timeout = timeout
                return conn, True
        return self._new_conn(timeout), False

    def _put_conn(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self.pool_size:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for c in idle:
            c.close()

    # -- requests -----------------------------------------------------------

    def path(self, p: str, query: Optional[Mapping[str, str]] = None) -> str:
        out = self.base_path + p
        if query:
            out += "?" + "&".join(f"{quote(k)}={quote(v, safe='')}" for k, v in query.items())
        return out

    def request(
        self,
        verb: str,
        path: str,
        body: Optional[bytes] = None,
        *,
        headers: Optional[Dict[str, str]] = None,
        timeout: Optional[float] = None,
        idempotent: bool = False,
        sink: Optional[IO[bytes]] = None,
        limit: Optional[int] = None,
    ) -> Tuple[int, http.client.HTTPMessage, bytes]:
        """Sends one request and returns (status, headers, body).

        With ``sink`` a 200 answer's body is written there (at most
        ``limit`` bytes) instead of returned. Failures to connect and broken
        connections raise ServerUnreachable; a non-200 answer is returned
        as is (the caller maps it).
        """
        t = timeout if timeout is not None else self.timeout
        attempt = 0
        while True:
            try:
                return self._once(verb, path, body, headers or {}, t, sink, limit)
            except ServerUnreachable:
                if not idempotent or attempt >= self.retries:
                    raise
            time.sleep(_RETRY_BACKOFF[attempt])
            attempt += 1

    def _once(
        self,
        verb: str,
        path: str,
        body: Optional[bytes],
        headers: Dict[str, str],
        timeout: float,
        sink: Optional[IO[bytes]],
        limit: Optional[int],
    ) -> Tuple[int, http.client.HTTPMessage, bytes]:
        hdrs = dict(headers)
        if self._auth:
            hdrs["Authorization"] = self._auth
        conn, reused = self._get_conn(timeout)
        try:
            conn.request(verb, path, body=body, headers=hdrs)
            resp = conn.getresponse()
            status = resp.status
            cap = limit if limit is not None else self.max_answer
            if sink is not None and status == 200:
                n = 0
                while True:
                    chunk = resp.read(_CHUNK)
                    if not chunk:
                        break
                    n += len(chunk)
                    if n > cap:
                        raise TooLarge(f"the answer to {verb} {path.split('?')[0]} is over {cap} bytes", kind="too_large")
                    sink.write(chunk)
                data = b""
            else:
                clen = resp.getheader("Content-Length")
                if clen is not None and clen.isdigit() and int(clen) > cap:
                    raise TooLarge(f"the answer to {verb} {path.split('?')[0]} is {clen} bytes, over {cap}", kind="too_large")
                data = resp.read(cap + 1)
                if len(data) > cap:
                    raise TooLarge(f"the answer to {verb} {path.split('?')[0]} is over {cap} bytes", kind="too_large")
        except WarrenError:
            conn.close()
            raise
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            what = "timed out" if isinstance(e, socket.timeout) else f"failed: {type(e).__name__}: {e}"
            raise ServerUnreachable(
                f"warren server at {self.server_url}: {verb} {path.split('?')[0]} {what}"
                + (" (after reusing a pooled connection)" if reused else "")
            ) from e
        if resp.will_close:
            conn.close()
        else:
            self._put_conn(conn)
        return status, resp.headers, data

    def call(
        self,
        method: str,
        params: Mapping[str, Any],
        *,
        timeout: Optional[float] = None,
        idempotent: bool = False,
    ) -> Any:
        """One JSON-RPC call; returns its result or raises its error."""
        body = json.dumps(
            {"jsonrpc": "2.0", "method": method, "params": params, "id": str(next(self._ids))},
            separators=(",", ":"),
        ).encode()
        attempt = 0
        while True:
            status, _, data = self.request(
                "POST", self.path("/api/v1/rpc"), body,
                headers={"Content-Type": "application/json"},
                timeout=timeout, idempotent=idempotent,
            )
            try:
                return decode_answer(method, status, data)
            except Unavailable:
                if not idempotent or attempt >= self.retries:
                    raise
            time.sleep(_RETRY_BACKOFF[attempt])
            attempt += 1


def decode_answer(what: str, status: int, data: bytes) -> Any:
    try:
        doc = json.loads(data) if data else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        snippet = data[:200].decode("utf-8", "replace")
        err = from_answer(status, None, f"{what}: HTTP {status}: {snippet!r} is not a JSON-RPC answer")
        raise err
    if status != 200 or "error" in doc:
        raise from_answer(status, doc.get("error"), f"{what}: HTTP {status}")
    return doc.get("result")
