"""warren.SandboxClient against the real server: lifecycle, exec, one-shot
runs (and their teardown on cancellation), files, processes, streaming,
terminals, REPL, metrics, and every SandboxSpec field reaching the server."""
from __future__ import annotations

import asyncio
import os
import tempfile
import time
import unittest
import uuid

import warren
from warren import SandboxSpec, sync

IMAGE = "python"  # the server's python alias (the host image here: no registry)


def name(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


class ClientTest(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self) -> None:
        self.c = warren.SandboxClient()
        self.sb = await self.c.create(SandboxSpec(name=name(), image=IMAGE, labels={"suite": "pysdk"}))

    async def asyncTearDown(self) -> None:
        await self.c.remove(self.sb.name)
        self.c.close()

    async def test_lifecycle(self) -> None:
        self.assertIn(self.sb.name, await self.c.list())
        got = await self.c.get(self.sb.name)
        info = await got.info()
        self.assertEqual((info.state, info.labels, info.memory_mib), ("running", {"suite": "pysdk"}, 512))
        with self.assertRaises(warren.Conflict):
            await self.c.create(SandboxSpec(name=self.sb.name, image=IMAGE))
        with self.assertRaises(warren.NotFound):
            await self.c.get(name("missing"))
        await self.sb.kill()
        self.assertEqual((await self.sb.info()).state, "stopped")
        with self.assertRaises(warren.Conflict):
            await self.sb.exec("true")
        await self.sb.start()
        self.assertTrue((await self.sb.exec("true")).ok)
        logs = await self.sb.logs()
        self.assertIn("exec true", logs)
        self.assertEqual(len((await self.sb.logs(tail=1)).splitlines()), 1)
        await self.c.remove(self.sb.name)
        self.assertNotIn(self.sb.name, await self.c.list())
        await self.c.remove(self.sb.name)  # idempotent

    async def test_exec(self) -> None:
        r = await self.sb.exec("echo", ["$HOME", "a b"])
        self.assertEqual(r, warren.ExecResult(stdout="$HOME a b\n"))  # no shell
        r = await self.sb.shell("echo out; echo err >&2; exit 3")
        self.assertEqual((r.stdout, r.stderr, r.exit_code, r.ok, r.output), ("out\n", "err\n", 3, False, "out\nerr\n"))
        r = await self.sb.exec("cat", stdin="in", env=["A=1"], cwd="/tmp")
        self.assertEqual(r.stdout, "in")
        self.assertEqual((await self.sb.exec("sh", ["-c", "echo $A; pwd"], env=["A=1"], cwd="/tmp")).stdout, "1\n/tmp\n")
        t0 = time.monotonic()
        d = await self.sb.exec_details("sleep", ["30"], timeout=0.5)
        self.assertTrue(d.timed_out)
        self.assertLess(time.monotonic() - t0, 10)
        r = await self.sb.exec("sleep", ["30"], timeout=0.3)
        self.assertFalse(r.ok)
        with self.assertRaises(warren.ExecFailed):
            await self.sb.exec("/no/such/binary")
        d = await self.sb.exec_details("printf", ["\\377\\000a"], binary=True)
        self.assertEqual((d.stdout_bytes, d.stdout), (b"\xff\x00a", "\ufffd\x00a"))

    async def test_concurrent_calls(self) -> None:
        # Many long calls at once do not queue behind each other.
        t0 = time.monotonic()
        rs = await asyncio.gather(*(self.sb.exec("sleep", ["1"]) for _ in range(12)))
        self.assertTrue(all(r.ok for r in rs))
        self.assertLess(time.monotonic() - t0, 6)

    async def test_sync_facade(self) -> None:
        def body() -> None:
            with sync.SandboxClient() as c:
                s = c.sandbox(self.sb.name)
                self.assertEqual(s.exec("echo", ["sync"]).stdout, "sync\n")
                self.assertEqual(s.shell("exit 4").exit_code, 4)
                self.assertIn(self.sb.name, c.list())
                events = list(s.stream("sh", ["-c", "echo a; exit 3"]))
                self.assertEqual([e.kind for e in events], ["started", "stdout", "exit"])
                self.assertEqual((events[1].data, events[2].exit_code), (b"a\n", 3))
                for ev in s.stream("sleep", ["60"]):
                    break  # the generator's close kills the process
                time.sleep(0.5)
                self.assertEqual([p for p in s.processes() if p.running], [])
        await asyncio.to_thread(body)

    async def test_files(self) -> None:
        await self.sb.write_file("/tmp/a.txt", "hello", mode=0o600)
        self.assertEqual(await self.sb.read_file("/tmp/a.txt"), b"hello")
        st = await self.sb.stat("/tmp/a.txt")
        self.assertEqual((st.size, st.mode & 0o777, st.type), (5, 0o600, "file"))
        await self.sb.mkdir("/tmp/d/e", parents=True)
        await self.sb.move("/tmp/a.txt", "/tmp/d/e/b.txt")
        self.assertEqual([f.name for f in await self.sb.list_files("/tmp/d/e")], ["b.txt"])
        self.assertTrue((await self.sb.stat("/tmp/d")).is_dir)
        with self.assertRaises(warren.NotFound):
            await self.sb.read_file("/tmp/a.txt")
        binary = bytes(range(256)) * 10
        await self.sb.write_file("/tmp/bin", binary)
        self.assertEqual(await self.sb.read_file("/tmp/bin"), binary)
        await self.sb.remove_file("/tmp/d", recursive=True)
        with self.assertRaises(warren.NotFound):
            await self.sb.stat("/tmp/d")

    async def test_dirs(self) -> None:
        with tempfile.TemporaryDirectory() as src, tempfile.TemporaryDirectory() as dst:
            os.makedirs(os.path.join(src, "sub"))
            with open(os.path.join(src, "sub", "x.py"), "w") as f:
                f.write("print(6*7)\n")
            os.symlink("sub/x.py", os.path.join(src, "link"))
            await self.sb.upload_dir(src, "/srv/app")
            self.assertEqual((await self.sb.exec("python3", ["/srv/app/link"])).stdout, "42\n")
            await self.sb.shell("echo made > /srv/app/sub/new.txt")
            await self.sb.download_dir("/srv/app", dst)
            with open(os.path.join(dst, "sub", "new.txt")) as f:
                self.assertEqual(f.read(), "made\n")
            self.assertEqual(os.readlink(os.path.join(dst, "link")), "sub/x.py")

    async def test_processes(self) -> None:
        p = await self.sb.start_process("sh", ["-c", "echo one; read x; echo got $x; echo e >&2"])
        chunk = await p.output(wait=10)
        self.assertEqual(chunk.data, b"one\n")
        await p.write_stdin("two\n", close=True)
        info = await p.wait(30)
        self.assertEqual((info.running, info.exit_code), (False, 0))
        rest = await p.output(offset=chunk.next_offset)
        self.assertEqual((rest.data, rest.eof), (b"got two\n", True))
        self.assertEqual((await p.output(stream="stderr")).data, b"e\n")
        s = await self.sb.start_process("sleep", ["60"])
        self.assertTrue((await s.info()).running)
        self.assertIn(s.id, [x.id for x in await self.sb.processes()])
        await s.signal("SIGTERM")
        done = await s.wait(30)
        self.assertEqual((done.running, done.signal), (False, "SIGTERM"))
        await s.remove()
        with self.assertRaises(warren.NotFound):
            await self.sb.process(s.id).info()

    async def test_stream(self) -> None:
        events = [ev async for ev in self.sb.stream("sh", ["-c", "echo a; sleep 0.2; echo b >&2; exit 5"])]
        kinds = [e.kind for e in events]
        self.assertEqual(kinds[0], "started")
        self.assertEqual(events[-1].kind, "exit")
        self.assertEqual(events[-1].exit_code, 5)
        self.assertEqual(b"".join(e.data for e in events if e.kind == "stdout"), b"a\n")
        self.assertEqual(b"".join(e.data for e in events if e.kind == "stderr"), b"b\n")
        # Output arrives as it is produced, not at the end.
        t0 = time.monotonic()
        first = None
        async for ev in self.sb.stream("sh", ["-c", "echo now; sleep 2; echo later"]):
            if ev.kind == "stdout" and first is None:
                first = time.monotonic() - t0
        self.assertIsNotNone(first)
        assert first is not None
        self.assertLess(first, 1.5)
        # Leaving early kills the process.
        async for ev in self.sb.stream("sleep", ["60"]):
            if ev.kind == "started":
                break
        await asyncio.sleep(0.5)
        self.assertEqual([p for p in await self.sb.processes() if p.running], [])
        with self.assertRaises(warren.NotFound):  # as sandbox.process.start answers
            async for _ in self.sb.stream("/no/such/binary"):
                pass

    async def test_stream_big(self) -> None:
        # 3 MiB in messages of the server's size; every byte accounted for.
        n = 3 << 20
        got = dropped = 0
        async for ev in self.sb.stream("head", ["-c", str(n), "/dev/zero"]):
            got += len(ev.data)
            dropped += ev.dropped
        self.assertEqual(got + dropped, n)

    async def test_pty(self) -> None:
        async with await self.sb.pty("/bin/sh", rows=30, cols=100) as t:
            await t.send("stty size; tty; exit 7\n")
            out = b""
            code = None
            async for ev in t:
                out += ev.data
                if ev.kind == "exit":
                    code = ev.exit_code
        self.assertIn(b"30 100", out)
        self.assertIn(b"/dev/pts/", out)
        self.assertEqual(code, 7)

    async def test_repl(self) -> None:
        r = await self.sb.repl("x = 6\nx * 7")
        self.assertEqual((r.status, r.result, r.stdout, r.has_error), ("success", "42", "42\n", False))
        r = await self.sb.repl("print(x + 1)\n1/0")
        self.assertEqual(r.stdout, "7\n")
        self.assertTrue(r.has_error)
        self.assertIn("ZeroDivisionError", r.stderr)
        r = await self.sb.repl("[1, 2].length", language="node")
        self.assertEqual(r.result, "2")

    async def test_metrics(self) -> None:
        m = await self.sb.metrics()
        self.assertEqual((m.name, m.running), (self.sb.name, True))
        self.assertIsNotNone(m.memory_usage)
        self.assertGreater(m.memory_usage or 0, 0)
        all_ = await self.c.metrics()
        self.assertIn(self.sb.name, [x.name for x in all_])


class OneShotTest(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self) -> None:
        self.c = warren.SandboxClient()

    async def asyncTearDown(self) -> None:
        self.c.close()

    async def test_run_python(self) -> None:
        before = set(await self.c.list())
        r = await self.c.run_python("print(1)", image=IMAGE)
        self.assertEqual(r, warren.ExecResult(stdout="1\n"))
        r = await self.c.run_shell("echo $0; exit 2", image=IMAGE)
        self.assertEqual((r.stdout, r.exit_code), ("/bin/sh\n", 2))
        r = await self.c.run_python("import sys; sys.exit('boom')", image=IMAGE, labels={"k": "v"})
        self.assertEqual((r.exit_code, r.stderr), (1, "boom\n"))
        self.assertEqual(set(await self.c.list()), before)  # all torn down

    async def test_run_failures_tear_down(self) -> None:
        before = set(await self.c.list())
        with self.assertRaises(warren.InvalidParams):
            await self.c.run_python("print(1)", image=IMAGE, memory_mib=1)
        with self.assertRaises(warren.Unavailable):  # no registry reachable from here
            await self.c.run_python("print(1)", image=IMAGE + "-nothing-here")
        self.assertEqual(set(await self.c.list()), before)

    async def test_cancel_tears_down(self) -> None:
        before = set(await self.c.list())
        task = asyncio.ensure_future(self.c.run_shell("sleep 60", image=IMAGE))
        new: set[str] = set()
        for _ in range(100):
            await asyncio.sleep(0.1)
            new = {n for n in await self.c.list() if n.startswith("sh-")} - before
            if new:
                break
        self.assertEqual(len(new), 1)
        await asyncio.sleep(0.3)  # the command runs
        t0 = time.monotonic()
        task.cancel()
        with self.assertRaises(asyncio.CancelledError):
            await task
        self.assertLess(time.monotonic() - t0, 15)
        self.assertEqual(set(await self.c.list()), before)

    async def test_spec_fields_reach_server(self) -> None:
        # Each of these fields is refused by this server (no workspace of
        # that name, no secret granted, an invalid egress rule): the refusal
        # names the field, which shows it was sent, and nothing is left.
        before = set(await self.c.list())
        cases = [({"workspace": "no-such-ws"}, "workspace"), ({"secrets": ("no-such-secret",)}, "secret"),
                 ({"egress": ("not a rule!",)}, "egress")]
        for fields, word in cases:
            with self.subTest(word):
                with self.assertRaises(warren.WarrenError) as cm:
                    await self.c.create(SandboxSpec(name=name(), image=IMAGE, **fields))  # type: ignore[arg-type]
                self.assertIn(cm.exception.kind, ("invalid_params", "not_found", "forbidden"))
                self.assertIn(word, str(cm.exception).lower())
        sb = await self.c.create(SandboxSpec(name=name(), image=IMAGE, memory_mib=256, cpus=2, labels={"a": "b"}))
        info = await sb.info()
        await self.c.remove(sb.name)
        self.assertEqual((info.memory_mib, info.cpus, info.labels), (256, 2, {"a": "b"}))
        self.assertEqual(set(await self.c.list()), before)


if __name__ == "__main__":
    unittest.main()
