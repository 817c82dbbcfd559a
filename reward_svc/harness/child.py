"""Entry point of a sandboxed evaluation child: ``python -m reward_svc.harness.child WORKDIR DEVICE``
(``services.children.entry``). It warms up with torch, Triton and, on a GPU, CUDA and the vendor
libraries; its job is a reference run, a candidate run, or (``prime``) nothing but the warm-up.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from reward_svc.protocol import CandidateSpec, ReferenceSpec
from services.children.entry import serve


def _warm_up(device: str) -> None:
    import torch

    try:
        import triton  # noqa: F401  (compiles nothing yet; its import is paid before the job arrives)
    except ImportError:
        pass
    if device == "cuda":
        torch.cuda.init()
        torch.empty(1, device="cuda")
        _warm_triton_driver()
        _warm_vendor_libraries()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


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
    if spec["role"] == "reference":
        from reward_svc.harness.reference import run_reference

        return dict(run_reference(cast(ReferenceSpec, spec), workdir))
    from reward_svc.harness.candidate import run_candidate

    return dict(
        run_candidate(cast(CandidateSpec, spec), workdir)
    )  # its trials' outputs are written by now, each with its fingerprint


if __name__ == "__main__":
    serve(handle, _warm_up)
