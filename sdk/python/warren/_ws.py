"""A minimal RFC 6455 WebSocket client on asyncio streams, enough for
/api/v1/ws: text frames of JSON, pings answered, fragments joined.

Bounds (the server is hostile input too): a message is at most
MAX_MESSAGE bytes, whatever its frames claim; the handshake's answer at
most 64 KiB of headers and 1 MiB of error body; every read of the
handshake has a timeout.
"""
from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import ssl
import struct
from typing import Any, Dict, Optional, Tuple

from ._transport import Transport, decode_answer
from .errors import ProtocolError, ServerUnreachable, TooLarge, WarrenError

MAX_MESSAGE = 16 << 20
_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
OP_CONT, OP_TEXT, OP_BIN, OP_CLOSE, OP_PING, OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA


def encode_frame(opcode: int, payload: bytes) -> bytes:
    """A final, masked client frame (clients must mask: RFC 6455 5.3)."""
    n = len(payload)
    head = bytes([0x80 | opcode])
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 1 << 16:
        head += bytes([0x80 | 126]) + struct.pack("!H", n)
    else:
        head += bytes([0x80 | 127]) + struct.pack("!Q", n)
    mask = os.urandom(4)
    return head + mask + mask_bytes(payload, mask)


def mask_bytes(payload: bytes, mask: bytes) -> bytes:
    # XOR by whole integers: fast without numpy.
    n = len(payload)
    if n == 0:
        return b""
    key = (mask * (n // 4 + 1))[:n]
    return (int.from_bytes(payload, "big") ^ int.from_bytes(key, "big")).to_bytes(n, "big")


class WebSocket:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, max_message: int) -> None:
        self._r = reader
        self._w = writer
        self._max = max_message
        self._send_lock = asyncio.Lock()
        self.closed = False

    @classmethod
    async def connect(cls, t: Transport, path: str, *, timeout: float, max_message: int = MAX_MESSAGE) -> "WebSocket":
        ctx = ssl.create_default_context() if t.scheme == "https" else None
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(t.host, t.port, ssl=ctx, limit=1 << 16), timeout)
        except (OSError, asyncio.TimeoutError) as e:
            raise ServerUnreachable(f"warren server at {t.server_url}: WebSocket connect failed: {e!r}") from e
        key = base64.b64encode(os.urandom(16)).decode()
        hdrs = [f"GET {path} HTTP/1.1", f"Host: {t.host}:{t.port}", "Upgrade: websocket", "Connection: Upgrade",
                f"Sec-WebSocket-Key: {key}", "Sec-WebSocket-Version: 13", f"Origin: {t.server_url}"]
        if t.authorization:
            hdrs.append(f"Authorization: {t.authorization}")
        writer.write(("\r\n".join(hdrs) + "\r\n\r\n").encode())
        try:
            status, headers = await asyncio.wait_for(_read_head(reader), timeout)
            if status != 101:
                body = b""
                n = headers.get("content-length", "")
                if n.isdigit():
                    body = await asyncio.wait_for(reader.readexactly(min(int(n), 1 << 20)), timeout)
                writer.close()
                decode_answer("WebSocket", status, body)
                raise ProtocolError(f"WebSocket handshake answered HTTP {status}")
        except WarrenError:  # before OSError: some are OSErrors too (PermissionError, ...)
            writer.close()
            raise
        except (OSError, ValueError, asyncio.TimeoutError, asyncio.IncompleteReadError) as e:
            writer.close()
            raise ServerUnreachable(f"warren server at {t.server_url}: WebSocket handshake failed: {e!r}") from e
        want = base64.b64encode(hashlib.sha1(key.encode() + _GUID).digest()).decode()
        if headers.get("sec-websocket-accept") != want:
            writer.close()
            raise ProtocolError("WebSocket handshake: wrong Sec-WebSocket-Accept")
        return cls(reader, writer, max_message)

    async def send_json(self, msg: Dict[str, Any]) -> None:
        await self._send(OP_TEXT, json.dumps(msg, separators=(",", ":")).encode())

    async def _send(self, op: int, payload: bytes) -> None:
        async with self._send_lock:
            self._w.write(encode_frame(op, payload))
            await self._w.drain()

    async def recv(self) -> Optional[bytes]:
        """The next data message, or None once the server closed."""
        parts: list[bytes] = []
        size = 0
        while True:
            fin, op, payload = await self._frame(self._max - size)
            if op == OP_PING:
                await self._send(OP_PONG, payload)
                continue
            if op == OP_PONG:
                continue
            if op == OP_CLOSE:
                if not self.closed:
                    self.closed = True
                    try:
                        await self._send(OP_CLOSE, payload[:2])
                    except OSError:
                        pass
                return None
            if op not in (OP_TEXT, OP_BIN, OP_CONT):
                raise ProtocolError(f"WebSocket: unknown opcode {op}")
            parts.append(payload)
            size += len(payload)
            if fin:
                return b"".join(parts)

    async def _frame(self, room: int) -> Tuple[bool, int, bytes]:
        try:
            b0, b1 = await self._r.readexactly(2)
            n = b1 & 0x7F
            if n == 126:
                (n,) = struct.unpack("!H", await self._r.readexactly(2))
            elif n == 127:
                (n,) = struct.unpack("!Q", await self._r.readexactly(8))
            if n > max(room, 125):
                raise TooLarge(f"WebSocket message over {self._max} bytes", kind="too_large")
            mask = await self._r.readexactly(4) if b1 & 0x80 else b""
            payload = await self._r.readexactly(n)
        except asyncio.IncompleteReadError:
            self.closed = True
            return True, OP_CLOSE, b""
        if mask:
            payload = mask_bytes(payload, mask)
        return bool(b0 & 0x80), b0 & 0x0F, payload

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                await self._send(OP_CLOSE, struct.pack("!H", 1000))
            except OSError:
                pass
        self._w.close()
        try:
            await self._w.wait_closed()
        except OSError:
            pass


async def _read_head(r: asyncio.StreamReader) -> Tuple[int, Dict[str, str]]:
    line = await r.readline()
    parts = line.decode("latin-1").split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise ProtocolError(f"WebSocket handshake: bad status line {line[:100]!r}")
    headers: Dict[str, str] = {}
    total = 0
    while True:
        h = await r.readline()
        total += len(h)
        if total > 1 << 16:
            raise TooLarge("WebSocket handshake: headers over 64 KiB", kind="too_large")
        if h in (b"\r\n", b"\n", b""):
            break
        k, _, v = h.decode("latin-1").partition(":")
        headers[k.strip().lower()] = v.strip()
    return int(parts[1]), headers
