"""A pool child whose job plants what native code in a candidate's process could: its result file or
its audit log made a FIFO, or a link to a host file (tests/test_reward_isolation.py). The harness's own
audit descriptor, opened before the "candidate" runs, still gets the line it refuses."""

import json
import os
import sys
from pathlib import Path

if __name__ == "__main__":
    workdir = Path(sys.argv[1])
    (workdir / "ready").touch()
    spec = json.loads(sys.stdin.readline())
    log = os.open(workdir / "audit.log", os.O_WRONLY | os.O_APPEND)  # the harness's, before anything untrusted runs
    plant, target = spec["plant"], workdir / spec["file"]
    if target.exists():
        os.rename(target, workdir / "moved-away")
    if plant == "fifo":
        os.mkfifo(target)
    elif plant == "link":
        os.symlink(spec["to"], target)
    os.write(log, b"gc.get_objects: refused after the swap\n")
    os._exit(0)
