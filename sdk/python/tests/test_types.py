"""The platform's types exactly as it defines them, and the package's shape."""
from __future__ import annotations

import base64
import dataclasses
import hashlib
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import unittest
import zipfile
from typing import Callable

import warren
from warren import sync
from warren.base import ExecResult, SandboxSpec


class TypesTest(unittest.TestCase):
    def test_exec_result(self) -> None:
        self.assertEqual([f.name for f in dataclasses.fields(ExecResult)], ["stdout", "stderr", "exit_code", "truncated"])
        r = ExecResult("out\n")
        self.assertEqual((r.stderr, r.exit_code, r.truncated, r.output, r.ok), ("", 0, False, "out\n", True))
        r = ExecResult("a", "b", 2)
        self.assertEqual((r.output, r.ok), ("ab", False))
        with self.assertRaises(dataclasses.FrozenInstanceError):
            r.stdout = "x"  # type: ignore[misc]

    def test_sandbox_spec(self) -> None:
        self.assertEqual([f.name for f in dataclasses.fields(SandboxSpec)],
                         ["name", "image", "memory_mib", "cpus", "workspace", "secrets", "egress", "labels"])
        s = SandboxSpec(name="x")
        self.assertEqual((s.image, s.memory_mib, s.cpus, s.workspace, s.secrets, s.egress, s.labels),
                         ("python:3.11-slim", 512, 1, None, (), (), {}))
        self.assertIsNot(s.labels, SandboxSpec(name="y").labels)
        with self.assertRaises(dataclasses.FrozenInstanceError):
            s.name = "z"  # type: ignore[misc]
        with self.assertRaises(TypeError):
            SandboxSpec()  # type: ignore[call-arg]

    def test_abstract_surface(self) -> None:
        from warren.base import SandboxClient, SandboxHandle
        self.assertTrue(issubclass(warren.SandboxClient, SandboxClient))
        self.assertTrue(issubclass(warren.Sandbox, SandboxHandle))
        with self.assertRaises(TypeError):
            SandboxClient()  # type: ignore[abstract]

    def test_errors_by_kind(self) -> None:
        from warren.errors import from_answer
        e = from_answer(404, {"code": -32003, "message": "no sandbox x", "data": {"kind": "not_found"}}, "f")
        self.assertIsInstance(e, warren.NotFound)
        self.assertIsInstance(e, LookupError)
        self.assertEqual((str(e), e.kind, e.http_status, e.code), ("no sandbox x", "not_found", 404, -32003))
        self.assertIsInstance(from_answer(409, {"code": -32004, "message": "m"}, "f"), warren.Conflict)  # by code
        self.assertIsInstance(from_answer(503, "<html>", "f"), warren.Unavailable)  # by status
        self.assertIsInstance(from_answer(400, None, "f"), warren.ProtocolError)
        self.assertIsInstance(from_answer(504, {"message": "t", "data": {"kind": "timeout"}}, "f"), TimeoutError)
        self.assertIsInstance(from_answer(401, {"message": "t", "data": {"kind": "unauthorized"}}, "f"), RuntimeError)

    def test_import_is_lazy(self) -> None:
        # import warren alone must not pull asyncio or http.client (import time).
        out = subprocess.run([sys.executable, "-c", "import sys, warren; print('asyncio' in sys.modules, "
                              "'http.client' in sys.modules); warren.SandboxSpec"],
                             capture_output=True, text=True, check=True,
                             env=dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(warren.__file__))))
        self.assertEqual(out.stdout.strip(), "False False")

    def test_key_never_in_repr(self) -> None:
        c = sync.SandboxClient("http://127.0.0.1:1", "msb_secretvalue")
        self.assertNotIn("secretvalue", repr(c.transport))
        with self.assertRaises(warren.ServerUnreachable) as cm:
            c.health()
        self.assertNotIn("secretvalue", str(cm.exception))


class SafeExtractTest(unittest.TestCase):
    """download_dir's archive is hostile: nothing may land outside the target."""

    def archive(self, add: Callable[[tarfile.TarFile], None]) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            add(tf)
        return buf.getvalue()

    def extract(self, data: bytes, dest: str) -> None:
        with tarfile.open(fileobj=io.BytesIO(data)) as tf:
            sync._safe_extract(tf, dest)

    def test_refused(self) -> None:
        def member(name: str, type_: bytes = tarfile.REGTYPE, link: str = "") -> Callable[[tarfile.TarFile], None]:
            def add(tf: tarfile.TarFile) -> None:
                ti = tarfile.TarInfo(name)
                ti.type, ti.linkname = type_, link
                tf.addfile(ti, io.BytesIO(b""))
            return add
        cases = {
            "dotdot": member("../escape"),
            "absolute": member("/tmp/escape"),
            "symlink out": member("l", tarfile.SYMTYPE, "/etc"),
            "symlink up": member("d/l", tarfile.SYMTYPE, "../../x"),
            "hardlink out": member("h", tarfile.LNKTYPE, "/etc/passwd"),
            "device": member("dev", tarfile.CHRTYPE),
        }
        with tempfile.TemporaryDirectory() as top:
            dest = os.path.join(top, "d")
            for what, add in cases.items():
                with self.subTest(what):
                    with self.assertRaises(warren.InvalidParams):
                        self.extract(self.archive(add), dest)
            self.assertEqual(os.listdir(top), ["d"] if os.path.exists(dest) else [])

    def test_plain(self) -> None:
        def add(tf: tarfile.TarFile) -> None:
            ti = tarfile.TarInfo("sub/a.txt")
            ti.size = 2
            tf.addfile(ti, io.BytesIO(b"hi"))
        with tempfile.TemporaryDirectory() as top:
            self.extract(self.archive(add), top)
            with open(os.path.join(top, "sub", "a.txt")) as f:
                self.assertEqual(f.read(), "hi")


if __name__ == "__main__":
    unittest.main()


class InstallTest(unittest.TestCase):
    def test_wheel(self) -> None:
        # What `pip install ./sdk/python` installs: the in-tree backend's
        # wheel (pip itself is left out: it takes ~10 s here).
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        sys.path.insert(0, os.path.join(root, "_build"))
        try:
            import backend
        finally:
            sys.path.pop(0)
        with tempfile.TemporaryDirectory() as out:
            name = backend.build_wheel(out)
            self.assertEqual(name, f"warren-{warren.__version__}-py3-none-any.whl")
            with zipfile.ZipFile(os.path.join(out, name)) as z:
                names = set(z.namelist())
                self.assertTrue({"warren/__init__.py", "warren/py.typed", "warren/msb.py",
                                 "warren-0.1.0.dist-info/METADATA", "warren-0.1.0.dist-info/RECORD"} <= names)
                record = z.read("warren-0.1.0.dist-info/RECORD").decode().splitlines()
                for line in record:
                    path, digest, size = line.rsplit(",", 2)
                    if path.endswith("RECORD"):
                        continue
                    data = z.read(path)
                    want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                    self.assertEqual((digest, int(size)), (f"sha256={want}", len(data)), path)
                z.extractall(out)
            res = subprocess.run([sys.executable, "-c", "import warren, warren.msb, warren.sync; print(warren.__file__)"],
                                 capture_output=True, text=True, check=True, cwd=out, env=dict(os.environ, PYTHONPATH=out))
            self.assertTrue(res.stdout.startswith(out))
