"""A pool child that writes the result its job claims, unsigned: what native code in a candidate's
process could do with a writable work dir (tests/test_reward_isolation.py)."""

import json
import os
import sys
from pathlib import Path

if __name__ == "__main__":
    workdir = Path(sys.argv[1])
    (workdir / "ready").touch()
    spec = json.loads(sys.stdin.readline())
    (workdir / "result.json").write_text(json.dumps(spec["claim"]))
    os._exit(0)
