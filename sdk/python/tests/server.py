"""A real ``warren serve`` for the tests, with API keys on: bin/warren of
this checkout (or $WARREN_BIN), its own temporary data and run
directories, a free loopback port, no disk pool. Needs root, as the
server does."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from typing import Any, Dict, Optional


def _binary() -> str:
    b = os.environ.get("WARREN_BIN")
    if b:
        return b
    d = os.path.dirname(os.path.abspath(__file__))
    while True:
        p = os.path.join(d, "bin", "warren")
        if os.path.isfile(p):
            return p
        parent = os.path.dirname(d)
        if parent == d:
            raise RuntimeError("no bin/warren above the tests and WARREN_BIN unset (run make build)")
        d = parent


class Server:
    def __init__(self) -> None:
        if os.geteuid() != 0:
            raise RuntimeError("warren serve needs root")
        self.bin = _binary()
        self.dir = tempfile.mkdtemp(prefix="warren-pysdk-")
        os.chmod(self.dir, 0o711)  # the sandboxes' unprivileged root must reach the data dir
        self.data = os.path.join(self.dir, "data")
        self.env = dict(os.environ, WARREN_KEEP_FILE_MAX="1", WARREN_DISK_POOL="off")
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.log_path = os.path.join(self.dir, "serve.log")
        try:
            self.key = self.make_key("*")
            self.scoped_key = self.make_key("team")
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            self.url = f"http://127.0.0.1:{port}"
            log = open(self.log_path, "wb")
            self.proc = subprocess.Popen(
                [self.bin, "serve", "--listen", f"127.0.0.1:{port}", "--prewarm", "1", "--data-dir", self.data,
                 "--run-dir", os.path.join(self.dir, "run")],
                env=self.env, stdout=log, stderr=subprocess.STDOUT)
            log.close()
            deadline = time.monotonic() + 30
            while True:
                try:
                    with urllib.request.urlopen(self.url + "/api/v1/health", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"warren serve did not become healthy in 30s; its log:\n{self.log()}")
                time.sleep(0.05)
        except BaseException:
            self.stop()
            raise

    def make_key(self, ns: str) -> str:
        out = subprocess.run([self.bin, "key", "create", "--namespace", ns, "--expire", "1d", "--data-dir", self.data],
                             env=self.env, check=True, capture_output=True, text=True)
        return out.stdout.strip()

    def log(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-8000:]
        except OSError:
            return ""

    def rpc(self, method: str, params: Dict[str, Any]) -> Any:
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()
        req = urllib.request.Request(self.url + "/api/v1/rpc", body,
                                     {"Content-Type": "application/json", "Authorization": "Bearer " + self.key})
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.load(r).get("result")

    def stop(self) -> None:
        """Removes every sandbox (they outlive the server), stops it, deletes its state."""
        errors = []
        if self.proc is not None and self.proc.poll() is None:
            try:
                for sb in self.rpc("sandbox.list", {"namespace": "*"}).get("sandboxes") or []:
                    self.rpc("sandbox.remove", {"sandbox": sb["name"], "namespace": sb["namespace"]})
            except Exception as e:  # noqa: BLE001
                errors.append(f"removing sandboxes: {e}")
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                errors.append("the server did not stop within 15s of SIGTERM")
        shutil.rmtree(self.dir, ignore_errors=True)
        if errors:
            raise RuntimeError("; ".join(errors))
