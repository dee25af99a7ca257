#!/usr/bin/env python3
"""What a whole `warren run -- /bin/true` costs, interleaved one by one:
BASE's warren, NEW's warren, and NEW's with --net egress (docs/performance.md).
Usage (root): scripts/runcost.py BASE_WARREN NEW_WARREN [ROUNDS]"""
import os, resource, shutil, statistics, subprocess, sys, tempfile, time

base, new = sys.argv[1], sys.argv[2]
n = int(sys.argv[3]) if len(sys.argv) > 3 else 40
top = tempfile.mkdtemp(prefix="warren-runcost-")
os.chmod(top, 0o755)
env = lambda d: dict(os.environ, WARREN_DATA_DIR=f"{top}/{d}/data", WARREN_RUN_DIR=f"{top}/{d}/run")
cmds = {
    "base": ([base, "run", "--", "/bin/true"], env("a")),
    "new": ([new, "run", "--", "/bin/true"], env("b")),
    "egress": ([new, "run", "--net", "egress", "--", "/bin/true"], env("b")),
}
wall = {k: [] for k in cmds}
cpu = {k: [] for k in cmds}
for i in range(n + 2):  # two rounds of warm-up
    for k, (argv, e) in cmds.items():
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        subprocess.run(argv, env=e, check=True)
        dt = time.perf_counter() - t
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        if i >= 2:
            wall[k].append(dt * 1000)
            cpu[k].append((r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime) * 1000)
for k in cmds:
    q = statistics.quantiles(wall[k], n=4)
    print(f"{k:7s} wall median {statistics.median(wall[k]):6.1f} ms (p25 {q[0]:.1f}, p75 {q[2]:.1f}), cpu median {statistics.median(cpu[k]):6.1f} ms")
for a, b in (("egress", "new"), ("new", "base")):
    print(f"{a} - {b}, paired median: {statistics.median(x - y for x, y in zip(wall[a], wall[b])):.1f} ms")
print("load average", os.getloadavg())
shutil.rmtree(top)  # every sandbox was removed: only files are left
