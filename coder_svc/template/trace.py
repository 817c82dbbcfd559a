"""Trace a module in a sandboxed child and validate the op graph it prints.

The module is untrusted: its constructor, ``get_init_inputs`` and ``get_inputs`` run only in the
child (``trace_child``), a warm child of the reward service's pool with the same sandbox as
reward evaluations (no network, private /tmp, hidden data dir, rlimits, wall-clock limit).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from pydantic import ValidationError

from coder_svc.template.graph import Graph
from services.children.layout import Layout
from services.children.pool import ChildPool
from services.config import Settings, get_settings

TRACE_TIMEOUT_S = 120.0
MAX_GRAPH_BYTES = 16 << 20
TRACE_CHILD = "coder_svc.template.trace_child"


class TraceError(Exception):
    """The module could not be traced; the message is the reason to decline."""


class Tracer:
    """Traces modules in warm sandboxed children (torch already imported): a trace costs the
    module's own build, not a Python and torch start-up. Children start when first needed."""

    def __init__(self, settings: Settings | None = None, timeout_s: float = TRACE_TIMEOUT_S, warm: int | None = None) -> None:
        self.settings, self.timeout_s = settings, timeout_s
        # one per four cores: the eval harness traces several problems at once on a big host
        self.warm = warm if warm is not None else max(1, min(4, (os.cpu_count() or 2) // 4))
        self._pool: ChildPool | None = None
        self._lock = threading.Lock()

    @property
    def pool(self) -> ChildPool:
        with self._lock:
            if self._pool is None:
                settings = self.settings or get_settings()
                layout = Layout(settings.data_dir / "coder" / "trace").create()
                self._pool = ChildPool(settings, layout, "cpu", self.timeout_s, self.warm, entry=TRACE_CHILD)
            return self._pool

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.close()
                self._pool = None

    def trace(self, source: str) -> Graph:
        child = self.pool.take()
        try:
            outcome, answer = child.run({"source": source}, max_result_bytes=MAX_GRAPH_BYTES)
            too_large = answer is None and _size(child.workdir / "result.json") > MAX_GRAPH_BYTES
        finally:
            child.discard()
        if outcome.timed_out:
            raise TraceError(f"tracing ran past {self.timeout_s:.0f} s")
        if too_large:
            raise TraceError("the op graph is too large")
        if answer is None:
            tail = " | ".join(outcome.stderr.decode(errors="replace").strip().splitlines()[-3:])
            raise TraceError(f"the trace child gave no graph ({outcome.describe()}): {tail}"[:500])
        if "error" in answer:
            raise TraceError(str(answer["error"])[:500])
        try:
            return Graph.model_validate(answer.get("graph"))
        except RecursionError:
            raise TraceError("the op graph is nested too deeply") from None
        except ValidationError as exc:
            raise TraceError(f"the op graph is malformed: {exc.errors()[0]['msg']}") from None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
