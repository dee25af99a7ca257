"""A/B: run_python("print(1)") end to end (create, run, stop, remove)
through this SDK (sync and async clients) and through the Go SDK's
RunPython, alternating in rounds against one real server, so that the
machine's load weighs on all alike. Also import times.

    make build && python3 sdk/python/bench/run_python_ab.py [ROUNDS] [PER_ROUND]

Prints each variant's median and the ratio to Go's. Needs root and Go.
"""
from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PYROOT = os.path.dirname(HERE)
REPO = os.path.dirname(os.path.dirname(PYROOT))
sys.path[:0] = [PYROOT, os.path.join(PYROOT, "tests")]

from server import Server  # noqa: E402

# The modules whose import -X importtime counts (top level only).
TOP = {"warren", "asyncio", "http", "json", "dataclasses", "uuid"}
PYCACHE = ""  # set by main: where the imports' bytecode goes

GO_MAIN = """package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/warren-sandbox/warren/sdk/warren"
)

func main() {
	n, _ := strconv.Atoi(os.Args[1])
	c := warren.New()
	ctx := context.Background()
	for i := 0; i < n; i++ {
		t0 := time.Now()
		res, err := c.RunPython(ctx, "print(1)", warren.RunImage("python"))
		if err != nil || res.Stdout != "1\\n" {
			fmt.Fprintln(os.Stderr, "run:", err, res.Stdout)
			os.Exit(1)
		}
		fmt.Println(time.Since(t0).Seconds())
	}
}
"""


def build_go(tmp: str) -> str:
    with open(os.path.join(tmp, "go.mod"), "w") as f:
        f.write("module bench\n\ngo 1.26\n\nrequire github.com/warren-sandbox/warren/sdk v0.0.0\n\n"
                f"replace github.com/warren-sandbox/warren/sdk => {REPO}/sdk\n")
    with open(os.path.join(tmp, "main.go"), "w") as f:
        f.write(GO_MAIN)
    out = os.path.join(tmp, "gorun")
    subprocess.run(["go", "build", "-o", out, "."], cwd=tmp, check=True, env=dict(os.environ, GOFLAGS="-mod=mod"))
    return out


def import_ms(stmt: str, n: int = 9) -> tuple[float, float]:
    """Median wall time of the package's imports (-X importtime, top-level
    warren modules only, not the interpreter's start-up) and median CPU time
    of the statement (less sensitive to a loaded machine), in ms."""
    wall, cpu = [], []
    code = f"import time; t = time.process_time(); {stmt}; print(time.process_time() - t)"
    # With bytecode, as an installed package has it (kept out of the tree).
    env = dict(os.environ, PYTHONPATH=PYROOT, PYTHONPYCACHEPREFIX=PYCACHE)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    subprocess.run([sys.executable, "-c", stmt], env=env, check=True)
    for _ in range(n):
        r = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True,
                           env=env, check=True)
        total = 0
        for line in r.stderr.splitlines():
            parts = line.split("|")
            if len(parts) != 3 or not parts[1].strip().isdigit():
                continue
            name = parts[2][1:]
            # Top-level imports the statement made (the interpreter's own
            # start-up, site and its hooks, ran before and is not counted).
            if not name.startswith(" ") and name.strip().split(".")[0] in TOP:
                total += int(parts[1])
        wall.append(total / 1000)
        cpu.append(float(r.stdout) * 1000)
    return statistics.median(wall), statistics.median(cpu)


def main() -> None:
    global PYCACHE
    PYCACHE = tempfile.mkdtemp(prefix="warren-bench-pyc-")
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    per = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    srv = Server()
    try:
        os.environ.update(MSB_SERVER_URL=srv.url, MSB_API_KEY=srv.key)
        import warren
        from warren import sync
        sc = sync.SandboxClient()
        ac = warren.SandboxClient()
        with tempfile.TemporaryDirectory() as tmp:
            gobin = build_go(tmp)
            res: dict[str, list[float]] = {"go": [], "py-sync": [], "py-async": []}

            async def arun() -> None:
                r = await ac.run_python("print(1)", image="python")
                assert r.stdout == "1\n", r

            for _ in range(rounds):
                out = subprocess.run([gobin, str(per)], capture_output=True, text=True, check=True)
                res["go"] += [float(x) for x in out.stdout.split()]
                for _ in range(per):
                    t0 = time.perf_counter()
                    r = sc.run_python("print(1)", image="python")
                    res["py-sync"].append(time.perf_counter() - t0)
                    assert r.stdout == "1\n", r
                for _ in range(per):
                    t0 = time.perf_counter()
                    asyncio.run(arun())
                    res["py-async"].append(time.perf_counter() - t0)
        go = statistics.median(res["go"])
        for k, v in res.items():
            m = statistics.median(v)
            print(f"run_python print(1) {k:9s} median {m * 1000:7.1f} ms  ({len(v)} runs, min {min(v) * 1000:.1f})"
                  f"  ratio to go {m / go:.2f}")
    finally:
        srv.stop()
    # The last line is the standard library the client needs, for reference:
    # on a loaded machine it is most of the client's import time.
    for stmt in ("import warren", "import warren; warren.SandboxClient", "import warren.msb",
                 "import asyncio, http.client, json, dataclasses, uuid"):
        wall, cpu = import_ms(stmt)
        print(f"{stmt:38s} {wall:6.1f} ms (-X importtime), {cpu:6.1f} ms CPU (medians of 9)")
    shutil.rmtree(PYCACHE, ignore_errors=True)
    print("load average:", " ".join(f"{x:.1f}" for x in os.getloadavg()))

if __name__ == "__main__":
    main()
