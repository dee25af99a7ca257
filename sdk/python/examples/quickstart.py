"""Quick start: a sandbox, commands in it, a one-shot run.

    MSB_SERVER_URL=http://127.0.0.1:5555 MSB_API_KEY=msb_... python3 quickstart.py
"""
import asyncio

from warren import SandboxClient, SandboxSpec


async def main() -> None:
    async with SandboxClient() as client:
        sb = await client.create(SandboxSpec(name="quickstart", image="python", labels={"team": "docs"}))
        try:
            res = await sb.exec("python3", ["-c", "print(6 * 7)"], timeout=60)
            print(res.stdout, end="")
            res = await sb.shell("echo from a shell; exit 3")
            print(res.output, end="")
            print("ok:", res.ok, "exit code:", res.exit_code)
        finally:
            await client.remove(sb.name)

        # Create, run, stop and remove in one call.
        res = await client.run_python("import sys; print(sys.version_info.major)", image="python")
        print("one-shot:", res.stdout, end="")


asyncio.run(main())
