# Per-file write, read and stat latency of N files of 4 KiB in DIR: the
# workspace models' measurement (docs/policy.md "Workspaces").
# Usage: python3 scripts/fsload.py DIR N
import os, sys, time
d = sys.argv[1]; n = int(sys.argv[2])
os.makedirs(d, exist_ok=True)
data = b"x" * 4096
t0 = time.perf_counter()
for i in range(n):
    with open(os.path.join(d, "f%d" % i), "wb") as f: f.write(data)
t1 = time.perf_counter()
for i in range(n):
    with open(os.path.join(d, "f%d" % i), "rb") as f: f.read()
t2 = time.perf_counter()
for i in range(n):
    os.stat(os.path.join(d, "f%d" % i))
t3 = time.perf_counter()
print("%s: write %.1f us/file, read %.1f us/file, stat %.1f us/file" % (d, (t1-t0)/n*1e6, (t2-t1)/n*1e6, (t3-t2)/n*1e6))
