"""The transport's connection handling. The real server is used where it
can show the behaviour; a small local HTTP server stands in where the point
is a failure the real one does not produce on demand (a dropped connection
mid-call, an idle connection closed under the pool)."""
from __future__ import annotations

import asyncio
import base64
import hashlib
import http.server
import json
import os
import socket
import struct
import threading
import time
import unittest
from typing import Any, Dict

import warren
from warren import sync
from warren._transport import Transport


class Flaky(http.server.BaseHTTPRequestHandler):
    """Answers JSON-RPC; drops the connection without an answer while
    server.drops > 0; closes kept-alive connections after answering when
    server.close_after."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *a: Any) -> None:
        pass

    def do_POST(self) -> None:
        srv: Any = self.server
        body = self.rfile.read(int(self.headers["Content-Length"]))
        with srv.lock:
            srv.requests.append(json.loads(body)["method"])
            srv.conns.add(self.client_address)
            drop = srv.drops > 0
            if drop:
                srv.drops -= 1
        if drop:
            self.close_connection = True
            return
        out = json.dumps({"jsonrpc": "2.0", "result": {"ok": True}, "id": "1"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)
        if srv.close_after:
            self.close_connection = True


class FakeServerTest(unittest.TestCase):
    def setUp(self) -> None:
        self.srv: Any = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Flaky)
        self.srv.lock = threading.Lock()
        self.srv.requests = []
        self.srv.conns = set()
        self.srv.drops = 0
        self.srv.close_after = False
        self.thread = threading.Thread(target=self.srv.serve_forever, daemon=True)
        self.thread.start()
        self.t = Transport(f"http://127.0.0.1:{self.srv.server_address[1]}", "k", timeout=5)

    def tearDown(self) -> None:
        self.t.close()
        self.srv.shutdown()
        self.srv.server_close()

    def test_pooled(self) -> None:
        for _ in range(5):
            self.assertEqual(self.t.call("sandbox.get", {}), {"ok": True})
        self.assertEqual(len(self.srv.conns), 1)

    def test_retry_only_idempotent(self) -> None:
        self.srv.drops = 1
        self.assertEqual(self.t.call("sandbox.get", {}, idempotent=True), {"ok": True})
        self.assertEqual(self.srv.requests, ["sandbox.get", "sandbox.get"])
        self.srv.requests.clear()
        self.srv.drops = 1
        with self.assertRaises(warren.ServerUnreachable):
            self.t.call("sandbox.exec", {})
        self.assertEqual(self.srv.requests, ["sandbox.exec"])  # sent once, never again

    def test_retries_bounded(self) -> None:
        self.srv.drops = 100
        with self.assertRaises(warren.ServerUnreachable):
            self.t.call("sandbox.get", {}, idempotent=True)
        self.assertEqual(len(self.srv.requests), 1 + self.t.retries)

    def test_closed_idle_connection_not_used(self) -> None:
        # The server closes each connection after its answer: a call that
        # must not be resent still goes through on a fresh connection.
        self.srv.close_after = True
        for _ in range(3):
            self.assertEqual(self.t.call("sandbox.exec", {}), {"ok": True})
            time.sleep(0.05)
        self.assertEqual(self.srv.requests, ["sandbox.exec"] * 3)


class SilentServerTest(unittest.TestCase):
    def test_timeout(self) -> None:
        # Accepts and never answers: the call ends at its timeout.
        with socket.socket() as ls:
            ls.bind(("127.0.0.1", 0))
            ls.listen(4)
            t = Transport(f"http://127.0.0.1:{ls.getsockname()[1]}", timeout=0.3, retries=0)
            t0 = time.monotonic()
            with self.assertRaises(warren.ServerUnreachable) as cm:
                t.call("sandbox.list", {})
            self.assertLess(time.monotonic() - t0, 3)
            self.assertIn("timed out", str(cm.exception))

    def test_server_down(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        c = sync.SandboxClient(f"http://127.0.0.1:{port}", retries=0)
        with self.assertRaises(warren.ServerUnreachable) as cm:
            c.list()
        self.assertIsInstance(cm.exception, ConnectionError)
        self.assertIn(f"127.0.0.1:{port}", str(cm.exception))


class RealServerTest(unittest.TestCase):
    def test_wrong_key(self) -> None:
        c = sync.SandboxClient(api_key="msb_not.a.key")
        with self.assertRaises(warren.Unauthorized) as cm:
            c.list()
        self.assertEqual((cm.exception.http_status, cm.exception.kind), (401, "unauthorized"))
        no_key = sync.SandboxClient(api_key="")
        with self.assertRaises(warren.Unauthorized):
            no_key.list()

    def test_scoped_key(self) -> None:
        c = sync.SandboxClient(api_key=os.environ["WARREN_TEST_SCOPED_KEY"], namespace="default")
        with self.assertRaises(warren.Forbidden):
            c.list()
        self.assertEqual(sync.SandboxClient(api_key=os.environ["WARREN_TEST_SCOPED_KEY"]).list(), [])

    def test_pool_reused(self) -> None:
        c = sync.SandboxClient()
        for _ in range(3):
            c.list()
        self.assertEqual(len(c.transport._idle), 1)
        c.close()

    def test_answer_bounded(self) -> None:
        # An answer over the client's bound is refused, not read whole: a
        # JSON-RPC answer (Content-Length) and a tar download (chunked).
        t = Transport(max_answer=16)
        with self.assertRaises(warren.TooLarge):
            t.call("sandbox.list", {"namespace": "*"})
        c = sync.SandboxClient()
        sb = c.create(warren.SandboxSpec(name="bounded", image="python"))
        try:
            sb.write_file("/tmp/big", b"x" * 100000)
            self.assertGreater(len(sb.download_tar("/tmp")), 100000)
            with self.assertRaises(warren.TooLarge):
                sb.download_tar("/tmp", limit=50000)
            self.assertEqual(sb.exec("true").exit_code, 0)  # the client goes on
        finally:
            c.remove(sb.name)

    def test_unknown_method(self) -> None:
        with self.assertRaises(warren.ProtocolError) as cm:
            sync.SandboxClient().call("sandbox.nope", {})
        self.assertEqual(cm.exception.kind, "method_not_found")

    def test_errors_dict(self) -> None:
        d: Dict[str, Any] = {}
        with self.assertRaises(warren.NotFound) as cm:
            sync.SandboxClient().get("no-such-box")
        d = cm.exception.data
        self.assertEqual(d.get("kind"), "not_found")
        self.assertTrue(d.get("request_id"))


if __name__ == "__main__":
    unittest.main()


async def hold(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    """Keeps a fake server's connection open until the client goes (or the test ends)."""
    try:
        await w.drain()
        await r.read()
    except (asyncio.CancelledError, ConnectionError):
        pass  # the test is over: the connection goes with its loop
    finally:
        w.close()


class HostileWebSocketTest(unittest.IsolatedAsyncioTestCase):
    """The WebSocket client bounds what a server sends."""

    async def serve(self, answer: bytes) -> str:
        async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            await r.readuntil(b"\r\n\r\n")
            w.write(answer)
            await hold(r, w)
        srv = await asyncio.start_server(handle, "127.0.0.1", 0)
        self.addAsyncCleanup(self.stop, srv)
        return f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"

    async def stop(self, srv: asyncio.base_events.Server) -> None:
        srv.close()
        await srv.wait_closed()

    def accept(self) -> bytes:
        return (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                b"Sec-WebSocket-Accept: %s\r\n\r\n")

    async def test_huge_frame_refused(self) -> None:
        from warren import _ws
        # A frame that claims 1 TiB: refused from its header, nothing allocated.
        orig = _ws.WebSocket.connect

        async def handshake_then(frame: bytes) -> _ws.WebSocket:
            async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
                head = (await r.readuntil(b"\r\n\r\n")).decode()
                key = [ln.split(":", 1)[1].strip() for ln in head.split("\r\n") if ln.lower().startswith("sec-websocket-key")][0]
                acc = base64.b64encode(hashlib.sha1(key.encode() + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
                w.write(self.accept() % acc + frame)
                await hold(r, w)
            srv = await asyncio.start_server(handle, "127.0.0.1", 0)
            self.addAsyncCleanup(self.stop, srv)
            t = Transport(f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}")
            return await orig(t, "/api/v1/ws", timeout=5)

        ws = await handshake_then(b"\x81\x7f" + struct.pack("!Q", 1 << 40))
        with self.assertRaises(warren.TooLarge):
            await ws.recv()
        await ws.close()
        # Fragments that add up past the bound are refused too.
        frag = b"\x01\x7f" + struct.pack("!Q", 10 << 20) + b"x" * (10 << 20)
        ws = await handshake_then(frag + b"\x80\x7f" + struct.pack("!Q", 10 << 20))
        with self.assertRaises(warren.TooLarge):
            await ws.recv()
        await ws.close()

    async def test_refused_handshake(self) -> None:
        body = b'{"jsonrpc":"2.0","error":{"code":-32001,"message":"bad key","data":{"kind":"unauthorized"}}}'
        url = await self.serve(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        from warren import _ws
        with self.assertRaises(warren.Unauthorized):
            await _ws.WebSocket.connect(Transport(url), "/api/v1/ws", timeout=5)

    async def test_silent_handshake(self) -> None:
        url = await self.serve(b"")
        from warren import _ws
        t0 = time.monotonic()
        with self.assertRaises(warren.ServerUnreachable):
            await _ws.WebSocket.connect(Transport(url), "/api/v1/ws", timeout=0.3)
        self.assertLess(time.monotonic() - t0, 3)
