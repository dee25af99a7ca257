"""Code written for microsandbox's Python SDK, with only the import changed.

    MSB_SERVER_URL=... MSB_API_KEY=... python3 msb_hello.py
"""
import asyncio

from warren.msb import PythonSandbox


async def main() -> None:
    async with PythonSandbox.create(name="msb-hello") as sb:
        exec = await sb.run("name = 'Python'\nprint(f'Hello {name}!')")
        print(await exec.output(), end="")
        cmd = await sb.command.run("echo", ["from a command"])
        print(await cmd.output(), end="")
        print("running:", await sb.metrics.is_running())


asyncio.run(main())
