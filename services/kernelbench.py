"""KernelBench's result shapes, from the reward service's verdicts: ``KernelExecResult`` (what
``src/kernelbench/eval.py``'s ``eval_kernel_against_ref`` returns) and the ``eval_results.json`` that
``scripts/eval_from_generations.py`` writes. Read from KernelBench's own source (github.com/ScalingIntelligence/KernelBench,
commit 423217d), so scripts that read either keep working on verdicts of the hardened scorer.

KernelBench's timings are milliseconds (its ``timing.get_timing_stats``, whatever the field comments
say); so are these. What KernelBench has no field for (the verdict, the guard that rejected a hack,
the reason) goes into ``metadata``, under the keys KernelBench itself uses where it has one
(``compilation_error``, ``runtime_error``, ``correctness_issue``, ``max_difference``, ``excessive_speedup``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, Field

NO_MODEL_NEW = "Syntax error in custom generated code or ModelNew not found"


class KernelExecResult(BaseModel):
    """KernelBench's ``KernelExecResult``, field for field."""

    compiled: bool = False
    correctness: bool = False
    metadata: dict[str, Any] = Field(default_factory=dict)
    runtime: float = -1.0  # ms, where performance was measured
    runtime_stats: dict[str, Any] = Field(default_factory=dict)
    ref_runtime: float = -1.0
    ref_runtime_stats: dict[str, Any] = Field(default_factory=dict)


def exec_result(
    status: str,
    reason: str,
    *,
    guard: str | None = None,
    runtime_ms: float | None = None,
    ref_runtime_ms: float | None = None,
    max_abs_error: float | None = None,
    device: str | None = None,
    trials: int | None = None,
    excessive_speedup_threshold: float | None = None,
) -> KernelExecResult | None:
    """A verdict as KernelBench would have reported it; None for ``unverified`` (KernelBench's None: not
    evaluated, try again)."""
    if status == "unverified":
        return None
    metadata: dict[str, Any] = {"kernelzero_status": status, "kernelzero_reason": reason}
    if device:
        metadata["device"] = device
    if guard:
        metadata["kernelzero_guard"] = guard
    if status in ("compile_error", "declined"):
        metadata["compilation_error_name"] = "CompilationError" if status == "compile_error" else "SyntaxError"
        metadata["compilation_error"] = reason if status == "compile_error" else NO_MODEL_NEW
        return KernelExecResult(compiled=False, metadata=metadata)
    if max_abs_error is not None:
        metadata["max_difference"] = [f"{max_abs_error:.6f}"]
    if status == "correct":
        if trials is not None:
            metadata["correctness_trials"] = f"({trials} / {trials})"
        result = KernelExecResult(compiled=True, correctness=True, metadata=metadata)
        if runtime_ms is not None:
            result.runtime, result.runtime_stats = runtime_ms, {"mean": runtime_ms, "device": device}
        if ref_runtime_ms is not None:
            result.ref_runtime, result.ref_runtime_stats = ref_runtime_ms, {"mean": ref_runtime_ms, "device": device}
        if (
            excessive_speedup_threshold
            and runtime_ms
            and ref_runtime_ms
            and ref_runtime_ms / runtime_ms > excessive_speedup_threshold
        ):
            metadata["excessive_speedup"] = True
        return result
    if status == "incorrect":
        metadata["correctness_issue"] = reason
    elif status == "rejected":
        metadata["correctness_issue"] = f"rejected by the {guard} guard: {reason}"
    else:  # runtime_error, timeout
        metadata["runtime_error_name"] = "TimeoutError" if status == "timeout" else "RuntimeError"
        metadata["runtime_error"] = reason
    return KernelExecResult(compiled=True, correctness=False, metadata=metadata)


def problem_number(problem: str) -> int | None:
    """KernelBench's problem id from a problem file's name ("level1/19_ReLU" -> 19); None without one."""
    match = re.match(r"^(\d+)_", problem.rsplit("/", 1)[-1])
    return int(match.group(1)) if match else None


def eval_results(records: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """``eval_results.json``'s content for one level: ``{problem_id: [{sample_id, compiled, correctness,
    metadata, runtime, runtime_stats}]}`` sorted by id, from ``kernelzero eval``'s sample records (those not
    judged, and problems without a number, left out)."""
    results: dict[int, list[dict[str, Any]]] = {}
    for record in records:
        number = problem_number(record["problem"])
        result = None
        if number is not None and record["status"] != "error":
            result = exec_result(
                record["status"],
                record["reason"],
                runtime_ms=record.get("runtime_ms"),
                ref_runtime_ms=record.get("ref_runtime_ms"),
                device=record.get("device"),
            )
        if result is not None and number is not None:
            entry = result.model_dump(include={"compiled", "correctness", "metadata", "runtime", "runtime_stats"})
            results.setdefault(number, []).append({"sample_id": record["sample"], **entry})
    return {str(n): sorted(results[n], key=lambda e: e["sample_id"]) for n in sorted(results)}
