"""Entry point of a sandboxed evaluation child: ``python -m reward_svc.harness.child WORKDIR DEVICE``
(``services.children.entry``). It warms up with torch, Triton and, on a GPU, CUDA and the vendor
libraries; its job is a reference run, a candidate run, or one of the worker's own builds that its
children share (``reward_svc/shared_builds.py``): ``prime`` (nothing but the warm-up) or
``precompiled_headers``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from reward_svc.compile import build_precompiled_headers, warm_header_screen
from reward_svc.protocol import CandidateSpec, ReferenceSpec
from services.children.entry import serve


def warm_up(device: str) -> None:
    import torch

    try:
        import triton  # noqa: F401  (compiles nothing yet; its import is paid before the job arrives)
    except ImportError:
        pass
    _rehearse_a_recorded_call()
    if device == "cuda":
        warm_header_screen()  # where load_inline builds for real (on the CPU it only checks a compile)
        torch.cuda.init()
        torch.empty(1, device="cuda")
        _warm_triton_driver()
        _warm_vendor_libraries()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def _rehearse_a_recorded_call() -> None:
    """A tiny forward on the host, run as trials run (the harness's modules, the op recorder, the judged
    conditions): what a job's first ops load then is loaded here instead. Inside a trial it would be
    paid in the device hold, where a timing waiting for the device waits for it: torch loads its
    Python reference implementations and symbolic shapes, with sympy, at the first ``broadcast_shapes``
    (the template candidates' first line), seconds on a busy host."""
    import torch

    from reward_svc.harness import reference  # noqa: F401  (a reference job's harness)
    from reward_svc.harness.judged import judged_conditions
    from services.children.ops import OpRecorder

    x = torch.ones(2, 3, 4, 4)
    with torch.no_grad(), judged_conditions(), OpRecorder():
        torch.broadcast_shapes(x.shape, (3, 1, 1))
        y = torch.nn.functional.conv2d(x, torch.ones(2, 3, 1, 1)) @ torch.ones(4, 4)
        torch.nn.functional.group_norm(y, 1).softmax(-1).logsumexp(-1)


def _warm_triton_driver() -> None:
    """Launch one trivial kernel: Triton builds its driver stubs with gcc on first use (seconds);
    paying that before the job arrives keeps it off the candidate's clock."""
    try:
        import torch

        from reward_svc.harness.warmup_kernel import touch
    except ImportError:
        return
    touch[(1,)](torch.empty(1, device="cuda"))
    torch.cuda.synchronize()


def _warm_vendor_libraries() -> None:
    """cuBLAS and cuDNN load and create their handles at first use (up to a second); a reference
    with a Linear or a Conv would otherwise pay that inside its device hold."""
    import torch

    x = torch.ones(1, 1, 8, 8, device="cuda")
    torch.nn.functional.conv2d(x, torch.ones(1, 1, 3, 3, device="cuda"))
    x[0, 0] @ x[0, 0]
    torch.cuda.synchronize()


def handle(spec: dict[str, Any], workdir: Path, device: str) -> dict[str, Any]:
    if spec["role"] == "prime":  # warm-up only: its Triton cache becomes the pool's base layer
        return {"status": "ok"}
    if spec["role"] == "precompiled_headers":  # our headers only: what every build starts from
        build_precompiled_headers(workdir / "precompiled-headers", compile_only=device != "cuda")
        return {"status": "ok"}
    if spec["role"] == "reference":
        from reward_svc.harness.reference import run_reference

        return dict(run_reference(cast(ReferenceSpec, spec), workdir))
    from reward_svc.harness.candidate import run_candidate

    return dict(
        run_candidate(cast(CandidateSpec, spec), workdir)
    )  # its trials' outputs are written by now, each with its fingerprint


if __name__ == "__main__":
    serve(handle, warm_up)
