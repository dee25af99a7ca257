"""A stdlib-only client that sends exactly what microsandbox's Python SDK
(generation A: namespace in every call) sends, and parses answers the way it
does. Usage: msb_client.py SERVER_URL [API_KEY]. Exits non-zero on the first
mismatch, printing what went wrong."""
import json
import sys
import urllib.error
import urllib.request
import uuid

SERVER = sys.argv[1].rstrip("/")
KEY = sys.argv[2] if len(sys.argv) > 2 else ""
NS = "default"
NAME = "py-" + uuid.uuid4().hex[:8]


def rpc(method, params):
    body = json.dumps({"jsonrpc": "2.0", "method": method, "params": params,
                       "id": str(uuid.uuid4())}).encode()
    headers = {"Content-Type": "application/json"}
    if KEY:
        headers["Authorization"] = f"Bearer {KEY}"
    req = urllib.request.Request(f"{SERVER}/api/v1/rpc", data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            status, text = resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    if status != 200:
        raise RuntimeError(f"{method}: HTTP {status}: {text}")
    data = json.loads(text)
    if "error" in data:
        raise RuntimeError(f"{method}: {data['error']['message']}")
    return data["result"]


def check(cond, what):
    if not cond:
        print("FAIL:", what, file=sys.stderr)
        sys.exit(1)


# PythonSandbox.start(): default image, memory 512, cpus int(round(1.0)).
res = rpc("sandbox.start", {"namespace": NS, "sandbox": NAME,
                            "config": {"image": "microsandbox/python", "memory": 512, "cpus": 1}})
check(res == f"Sandbox {NAME} started successfully", f"start result {res!r}")
try:
    # sandbox.run(code)
    out = rpc("sandbox.repl.run", {"sandbox": NAME, "namespace": NS, "language": "python",
                                   "code": "import sys\nx = 6 * 7\nprint(x)\nprint('oops', file=sys.stderr)"})
    stdout = "\n".join(o["text"] for o in out.get("output", []) if o.get("stream") == "stdout")
    stderr = "\n".join(o["text"] for o in out.get("output", []) if o.get("stream") == "stderr")
    has_error = out.get("status") in ("error", "exception") or bool(stderr)
    check(out["status"] == "success" and stdout == "42" and stderr == "oops" and has_error,
          f"repl result {out!r}")
    out = rpc("sandbox.repl.run", {"sandbox": NAME, "namespace": NS, "language": "python", "code": "print(x + 1)"})
    check([o["text"] for o in out["output"]] == ["43"], f"state kept {out!r}")
    # sandbox.command.run(command, args, timeout)
    out = rpc("sandbox.command.run", {"sandbox": NAME, "namespace": NS, "command": "sh",
                                      "args": ["-c", "echo hi; exit 2"], "timeout": 30})
    check(out["exit_code"] == 2 and out["success"] is False and out["output"][0] == {"stream": "stdout", "text": "hi"},
          f"command result {out!r}")
    # sandbox.metrics.get: clients take the first element
    out = rpc("sandbox.metrics.get", {"sandbox": NAME, "namespace": NS})
    m = out["sandboxes"][0]
    check(m["name"] == NAME and m["namespace"] == NS and m["running"] is True
          and isinstance(m["memory_usage"], (int, float)) and isinstance(m["cpu_usage"], (int, float)),
          f"metrics {out!r}")
finally:
    res = rpc("sandbox.stop", {"namespace": NS, "sandbox": NAME})
check(res == f"Sandbox {NAME} stopped successfully", f"stop result {res!r}")
# Errors: a non-200 answer with a JSON-RPC error object and a message.
try:
    rpc("sandbox.command.run", {"sandbox": NAME, "namespace": NS, "command": "true"})
    check(False, "command in a stopped sandbox succeeded")
except RuntimeError as e:
    check("HTTP 409" in str(e) and "stopped" in str(e), f"error {e}")
print("ok")
