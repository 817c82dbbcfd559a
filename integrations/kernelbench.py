"""KernelBench: a drop-in for ``kernelbench.eval.eval_kernel_against_ref`` that scores on the reward
service (sandboxed, with its anti-hacking guards) instead of in the caller's process.

A KernelBench script switches with one import::

    # from kernelbench.eval import eval_kernel_against_ref
    from integrations.kernelbench import eval_kernel_against_ref

The signature is KernelBench's (commit 423217d, ``src/kernelbench/eval.py``), its result a
``KernelExecResult`` with its fields, and ``None`` where KernelBench returns None (not evaluated: try
again) — here when the service could not judge the kernel (no device of the kind, the job failed, no
answer). Where the service listens comes from ``KZ_HOST``/``KZ_REWARD_PORT`` or the ``url`` keyword,
the key from ``KZ_API_KEY`` or the data dir. What does not carry over: ``timing_method``, ``build_dir``
and ``num_perf_trials`` (the service times on its own terms, exclusive per GPU), ``seed_num`` (it draws
its own secret inputs), the GPU index (the
service picks its GPU; ``device`` only says GPU or CPU), and backends other than ``cuda`` and
``triton``, or a precision other than float32, which are refused with the reason.
"""

from __future__ import annotations

import os
from typing import Any

from services.clients import JobTimeout, RewardClient, ServiceError, ServiceUnreachable
from services.kernelbench import KernelExecResult, exec_result
from services.schemas.reward import ScoreOptions

SUPPORTED_BACKENDS = ("cuda", "triton")

__all__ = ["KernelExecResult", "eval_kernel_against_ref"]


def eval_kernel_against_ref(
    original_model_src: str,
    custom_model_src: str,
    seed_num: int = 42,
    num_correct_trials: int = 1,
    num_perf_trials: int = 10,
    measure_performance: bool = False,
    timing_method: str = "cuda_event",
    verbose: bool = False,
    build_dir: os.PathLike[str] | None = None,
    device: Any = None,
    backend: str = "cuda",
    precision: Any = None,
    check_for_excessive_speedup: bool = True,
    excessive_speedup_threshold: float = 10,
    *,
    url: str | None = None,
    api_key: str | None = None,
    wait_s: float = 900.0,
) -> KernelExecResult | None:
    """KernelBench's ``eval_kernel_against_ref``, judged by the reward service (see the module's note)."""
    if backend.lower() not in SUPPORTED_BACKENDS:
        raise ValueError(f"backend {backend!r}: the reward service scores {' and '.join(SUPPORTED_BACKENDS)} kernels")
    if precision is not None and str(precision).removeprefix("torch.") not in ("float32", "fp32"):
        raise ValueError(f"precision {precision}: the reward service checks float32 (KernelBench's default)")
    options = ScoreOptions(
        backend=backend.lower(),
        device=scoring_device(device),
        trials=max(1, min(num_correct_trials, 20)),
        measure_speed=measure_performance,
    )
    try:
        with RewardClient(url, api_key) as client:
            answer = client.score(original_model_src, custom_model_src, options, wait_s=wait_s)
    except (ServiceError, ServiceUnreachable, JobTimeout) as exc:
        if verbose:
            print(f"[Eval] the reward service could not judge the kernel: {exc}")
        return None
    verdict = answer.verdict
    if verdict is None:
        if verbose:
            print(f"[Eval] job {answer.job_id} {answer.job_status}: {answer.error}")
        return None
    if verbose:
        print(f"[Eval] {verdict.status}: {verdict.reason}")
    return exec_result(
        verdict.status,
        verdict.reason,
        guard=verdict.guard,
        runtime_ms=verdict.runtime_ms,
        ref_runtime_ms=verdict.ref_runtime_ms,
        max_abs_error=verdict.max_abs_error,
        device=verdict.device,
        trials=options.trials,
        excessive_speedup_threshold=excessive_speedup_threshold if check_for_excessive_speedup else None,
    )


def scoring_device(device: Any) -> str:
    """KernelBench's ``device`` (a torch.device, a GPU index, None) as the service's: cpu, cuda or auto."""
    if device is None:
        return "auto"
    text = str(getattr(device, "type", device))
    return "cpu" if text == "cpu" else "cuda"
