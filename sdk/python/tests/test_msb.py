"""warren.msb: microsandbox's classes, used as microsandbox's README uses
them, against the real server (MSB_SERVER_URL/MSB_API_KEY from the runner)."""
from __future__ import annotations

import unittest

from warren import errors, sync
from warren.msb import NodeSandbox, PythonSandbox


class MsbTest(unittest.IsolatedAsyncioTestCase):
    async def test_python(self) -> None:
        async with PythonSandbox.create(name="msb-py") as sb:
            exec1 = await sb.run("name = 'Python'\nprint(f'Hello {name}!')")
            self.assertEqual(await exec1.output(), "Hello Python!\n")
            self.assertFalse(exec1.has_error())
            exec2 = await sb.run("print(name)\nraise ValueError('x')")  # state kept
            self.assertEqual(await exec2.output(), "Python\n")
            self.assertTrue(exec2.has_error())
            self.assertIn("ValueError", await exec2.error())

            cmd = await sb.command.run("ls", ["/"])
            self.assertTrue(cmd.success)
            self.assertEqual(cmd.exit_code, 0)
            self.assertIn("tmp", (await cmd.output()).split())
            fail = await sb.command.run("sh", ["-c", "echo no >&2; exit 3"])
            self.assertEqual((fail.exit_code, fail.success, await fail.error()), (3, False, "no\n"))
            with self.assertRaises(errors.ExecFailed):
                await sb.command.run("/no/such/binary")
            with self.assertRaises(errors.Timeout):
                await sb.command.run("sleep", ["10"], timeout=0.3)

            self.assertTrue(await sb.metrics.is_running())
            self.assertGreater(await sb.metrics.memory() or 0, 0)
            self.assertIsNotNone(await sb.metrics.cpu())
            self.assertEqual((await sb.metrics.all())["name"], "msb-py")
        # Stopped when the block ended.
        self.assertEqual(sync.SandboxClient().get("msb-py").info().state, "stopped")
        sync.SandboxClient().remove("msb-py")

    async def test_stopped_on_error(self) -> None:
        with self.assertRaises(ZeroDivisionError):
            async with PythonSandbox.create(name="msb-err"):
                1 / 0
        self.assertEqual(sync.SandboxClient().get("msb-err").info().state, "stopped")
        sync.SandboxClient().remove("msb-err")

    async def test_node(self) -> None:
        async with NodeSandbox.create() as sb:
            ex = await sb.run("console.log(6 * 7)")
            self.assertEqual(await ex.output(), "42\n")
            name = sb.name
        sync.SandboxClient().remove(name)

    async def test_not_started(self) -> None:
        sb = PythonSandbox()
        with self.assertRaises(RuntimeError):
            await sb.run("1")

    async def test_bad_key(self) -> None:
        with self.assertRaises(errors.Unauthorized) as cm:
            async with PythonSandbox.create(api_key="msb_wrong"):
                pass
        self.assertIsInstance(cm.exception, RuntimeError)  # as microsandbox's SDK raises


if __name__ == "__main__":
    unittest.main()
