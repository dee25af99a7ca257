"""The examples run against the real server and print what they should."""
from __future__ import annotations

import os
import subprocess
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(name: str) -> str:
    out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", name)], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, PYTHONPATH=ROOT))
    if out.returncode != 0:
        raise AssertionError(f"{name} exited {out.returncode}: {out.stderr}")
    return out.stdout


class ExamplesTest(unittest.TestCase):
    def test_quickstart(self) -> None:
        self.assertEqual(run("quickstart.py"),
                         "42\nfrom a shell\nok: False exit code: 3\none-shot: 3\n")

    def test_stream(self) -> None:
        self.assertEqual(run("stream.py"), "tick 1\ntick 2\ntick 3\nexit code 0\nrepl result: 12\nsync: hello\n")

    def test_msb_hello(self) -> None:
        self.assertEqual(run("msb_hello.py"), "Hello Python!\nfrom a command\nrunning: True\n")


if __name__ == "__main__":
    unittest.main()
