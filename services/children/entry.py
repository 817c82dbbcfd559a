"""The one shape of every sandboxed child's entry point: ``python -m MODULE WORKDIR DEVICE``.

A child warms up first (imports what its job will need), marks itself ready and only then blocks on
stdin for its one job, so a pool can keep warm children. It takes the signing key out of the job
before anything untrusted runs, answers in ``result.json`` signed with it (``report``), and exits
without finalizers, so nothing the untrusted code left behind runs after the answer. One child
serves exactly one job: no state survives from one to the next.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from services.children.report import take_key, write_result

Handler = Callable[[dict[str, Any], Path, str], dict[str, Any]]


def serve(handle: Handler, warm_up: Callable[[str], None] = lambda device: None, *, quiet_stdout: bool = False) -> NoReturn:
    """Run this process as a pooled child: ``warm_up(device)``, then ``handle(job, workdir, device)``
    once, its answer the result. ``quiet_stdout``: what the job prints goes to stderr (stdout is the
    pool's)."""
    workdir = Path(sys.argv[1])
    device = sys.argv[2] if len(sys.argv) > 2 else "cpu"
    warm_up(device)
    (workdir / "ready").touch()
    print("ready", flush=True)
    spec = json.loads(sys.stdin.readline())
    key = take_key(spec)  # before anything untrusted runs: the result it signs is the harness's
    if quiet_stdout:
        os.dup2(2, 1)
    result = handle(spec, workdir, device)
    write_result(workdir, key, result)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no finalizers: nothing the untrusted code left behind runs after its result is written
