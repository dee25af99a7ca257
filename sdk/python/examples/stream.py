"""Output as it is produced (over the WebSocket), files, a REPL, and the
synchronous client.

    MSB_SERVER_URL=... MSB_API_KEY=... python3 stream.py
"""
import asyncio

from warren import SandboxClient, SandboxSpec, sync


async def main() -> None:
    async with SandboxClient() as client:
        sb = await client.create(SandboxSpec(name="stream-demo", image="python"))
        try:
            async for ev in sb.stream("sh", ["-c", "for i in 1 2 3; do echo tick $i; sleep 0.1; done"]):
                if ev.kind == "stdout":
                    print(ev.data.decode(), end="")
                elif ev.kind == "exit":
                    print("exit code", ev.exit_code)
            await sb.write_file("/tmp/data.txt", "3 4\n")
            run = await sb.repl("a, b = map(int, open('/tmp/data.txt').read().split())\na * b")
            print("repl result:", run.result)
        finally:
            await client.remove(sb.name)


asyncio.run(main())

# The same calls without asyncio:
with sync.SandboxClient() as c:
    print("sync:", c.run_shell("echo hello", image="python").stdout, end="")
