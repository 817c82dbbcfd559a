"""Trace a module in a sandboxed child and validate the op graph it prints.

The module is untrusted: its constructor, ``get_init_inputs`` and ``get_inputs`` run only in the
child (``trace_child``), under the same sandbox as reward evaluations (no network, private /tmp,
hidden data dir, rlimits, wall-clock limit).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from pydantic import ValidationError

from coder_svc.template.graph import Graph
from services.config import Settings, get_settings
from services.sandbox import SandboxPolicy, run_sandboxed

TRACE_TIMEOUT_S = 120.0
MAX_GRAPH_BYTES = 16 << 20


class TraceError(Exception):
    """The module could not be traced; the message is the reason to decline."""


def trace_module(source: str, settings: Settings | None = None, timeout_s: float = TRACE_TIMEOUT_S) -> Graph:
    settings = settings or get_settings()
    root = settings.data_dir / "coder" / "trace"
    root.mkdir(parents=True, exist_ok=True)
    # The child's own writable scratch (torch wants a temp dir): the private /tmp can be read-only
    # when an import path lies under /tmp and is re-exposed there.
    with tempfile.TemporaryDirectory(dir=root) as workdir:
        policy = SandboxPolicy(
            wall_timeout_s=timeout_s,
            memory_bytes=settings.sandbox_memory_bytes,
            writable_dirs=(Path(workdir),),
            hidden_dirs=(settings.data_dir,),
            env={"PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "OMP_NUM_THREADS": "1", "TMPDIR": workdir,
                 "PYTHONDONTWRITEBYTECODE": "1", "CUDA_VISIBLE_DEVICES": ""},
            max_output_bytes=MAX_GRAPH_BYTES,
        )
        outcome = run_sandboxed([sys.executable, "-m", "coder_svc.template.trace_child"], policy,
                                stdin=source.encode(), cwd=Path(workdir))
    if outcome.timed_out:
        raise TraceError(f"tracing ran past {timeout_s:.0f} s")
    if outcome.stdout_truncated:
        raise TraceError("the op graph is too large")
    try:
        answer = json.loads(outcome.stdout)
    except (ValueError, RecursionError):
        tail = " | ".join(outcome.stderr.decode(errors="replace").strip().splitlines()[-3:])
        raise TraceError(f"the trace child gave no graph ({outcome.describe()}): {tail}"[:500]) from None
    if not isinstance(answer, dict):
        raise TraceError("the trace child's answer is not an object")
    if "error" in answer:
        raise TraceError(str(answer["error"])[:500])
    try:
        return Graph.model_validate(answer.get("graph"))
    except RecursionError:
        raise TraceError("the op graph is nested too deeply") from None
    except ValidationError as exc:
        raise TraceError(f"the op graph is malformed: {exc.errors()[0]['msg']}") from None
