"""warren.enclave against a mirror of ms-enclave's documented interface
(tests/mirror: ms-enclave itself cannot be installed here), with real
Warren sandboxes underneath."""
from __future__ import annotations

import asyncio
import os
import unittest

from ms_enclave.sandbox.boxes import SandboxFactory
from ms_enclave.sandbox.model import SandboxStatus

from warren import errors, sync
from warren.enclave import SANDBOX_TYPE, WarrenSandbox, WarrenSandboxConfig


class EnclaveTest(unittest.IsolatedAsyncioTestCase):
    async def test_lifecycle(self) -> None:
        sb = SandboxFactory.create_sandbox(SANDBOX_TYPE, WarrenSandboxConfig(image="python", memory_mib=256))
        self.assertIsInstance(sb, WarrenSandbox)
        self.assertEqual(sb.status, SandboxStatus.INITIALIZING)
        async with sb:
            self.assertEqual(sb.status, SandboxStatus.RUNNING)
            self.assertEqual(await sb.execute_tool("hello", {"name": "sandbox"}), "hello sandbox")  # tools initialized
            self.assertEqual(await sb.execute_command("echo hi; echo e >&2; exit 2"), (2, "hi\n", "e\n"))
            self.assertEqual(await sb.execute_command(["echo", "$HOME"]), (0, "$HOME\n", ""))
            code, _, err = await sb.execute_command("sleep 10", timeout=1)
            self.assertEqual(code, 124)
            self.assertIn("timed out", err)
            # Concurrent commands: each its own process, all answered.
            rs = await asyncio.gather(*(sb.execute_command(f"echo {i}") for i in range(6)))
            self.assertEqual([r[1] for r in rs], [f"{i}\n" for i in range(6)])
            info = sb.get_info()
            self.assertEqual((info["status"], info["image"], info["error"]), (SandboxStatus.RUNNING, "python", None))
            name = info["sandbox"]
            ctx = await sb.get_execution_context()
            self.assertIsInstance(ctx, sync.Sandbox)
            self.assertEqual(sync.SandboxClient().get(name).info().memory_mib, 256)
            # stop, then start again (files kept)
            await sb.execute_command("echo kept > /tmp/k")
            await sb.stop()
            self.assertEqual(sb.status, SandboxStatus.STOPPED)
            with self.assertRaises(RuntimeError):
                await sb.execute_command("true")
            await sb.start()
            self.assertEqual(await sb.execute_command("cat /tmp/k"), (0, "kept\n", ""))
        self.assertEqual(sb.status, SandboxStatus.STOPPED)
        self.assertNotIn(name, sync.SandboxClient().list())  # cleanup removed it
        await sb.cleanup()  # idempotent

    async def test_failed_start_recorded(self) -> None:
        sb = WarrenSandbox(WarrenSandboxConfig(image="python", memory_mib=1))
        with self.assertRaises(errors.InvalidParams):
            await sb.start()
        self.assertEqual(sb.status, SandboxStatus.ERROR)
        self.assertIn("memory", sb.metadata["error"])
        self.assertIn("memory", sb.get_info()["error"])
        await sb.cleanup()
        self.assertEqual(sb.status, SandboxStatus.ERROR)

    async def test_vanished_sandbox_recorded(self) -> None:
        sb = WarrenSandbox(WarrenSandboxConfig(image="python"))
        await sb.start()
        try:
            sync.SandboxClient().remove(sb.get_info()["sandbox"])
            with self.assertRaises(errors.NotFound):
                await sb.execute_command("true")
            self.assertEqual(sb.status, SandboxStatus.ERROR)
            self.assertIn("execute_command", sb.metadata["error"])
        finally:
            await sb.cleanup()

    async def test_unreachable_server(self) -> None:
        sb = WarrenSandbox(WarrenSandboxConfig(server_url="http://127.0.0.1:9", api_key=os.environ["MSB_API_KEY"]))
        with self.assertRaises(errors.ServerUnreachable):
            await sb.start()
        self.assertEqual(sb.status, SandboxStatus.ERROR)
        self.assertNotIn(os.environ["MSB_API_KEY"], sb.metadata["error"])
        await sb.cleanup()

    async def test_concurrent_start(self) -> None:
        sb = WarrenSandbox(WarrenSandboxConfig(image="python"))
        try:
            await asyncio.gather(sb.start(), sb.start(), sb.start())  # one sandbox, no conflict
            self.assertEqual(sb.status, SandboxStatus.RUNNING)
        finally:
            await sb.stop()
            await sb.cleanup()


if __name__ == "__main__":
    unittest.main()
