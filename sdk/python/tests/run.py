"""Runs the package's tests against a real ``warren serve`` (keys on):
starts it, points MSB_SERVER_URL/MSB_API_KEY (and WARREN_TEST_SCOPED_KEY, a
key for namespace "team") at it, runs every test_*.py here, stops it.

    python3 sdk/python/tests/run.py [-v] [unittest names...]
"""
from __future__ import annotations

import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE, os.path.join(HERE, "mirror")]

from server import Server  # noqa: E402


def main() -> int:
    srv = Server()
    code = 1
    try:
        os.environ.update(MSB_SERVER_URL=srv.url, MSB_API_KEY=srv.key, WARREN_TEST_SCOPED_KEY=srv.scoped_key)
        args = [a for a in sys.argv[1:] if a != "-v"]
        loader = unittest.TestLoader()
        suite = loader.loadTestsFromNames(args) if args else loader.discover(HERE, pattern="test_*.py")
        result = unittest.TextTestRunner(verbosity=2 if "-v" in sys.argv else 1).run(suite)
        code = 0 if result.wasSuccessful() and result.testsRun > 0 and not result.skipped else 1
        if result.skipped:
            print(f"{len(result.skipped)} tests skipped: a skip is a failure here", file=sys.stderr)
        if code:
            print("server log (tail):\n" + srv.log(), file=sys.stderr)
    finally:
        srv.stop()
    return code


if __name__ == "__main__":
    sys.exit(main())
