"""Entry point of a sandboxed evaluation child: ``python -m reward_svc.harness.child WORKDIR``.

It warms up first (imports torch and triton, initialises CUDA) and only then blocks on stdin for
its job, so a pool can keep warm children ready. One child serves exactly one job: no state
survives from one candidate to the next.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from reward_svc.harness.report import take_key, write_result


def _warm_up(device: str) -> None:
    import torch
    import torch._dynamo  # noqa: F401  (it rewraps torch.manual_seed on first import: let that happen before the integrity snapshot)

    try:
        import triton  # noqa: F401  (compiles nothing yet; importing costs ~0.5 s we'd rather pay early)
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


def main() -> None:
    workdir = Path(sys.argv[1])
    device = sys.argv[2] if len(sys.argv) > 2 else "cpu"
    _warm_up(device)
    (workdir / "ready").touch()
    print("ready", flush=True)
    spec = json.loads(sys.stdin.readline())
    key = take_key(spec)  # before anything untrusted runs: the result it signs is the harness's
    if spec["role"] == "prime":  # warm-up only: its Triton cache becomes the pool's base layer
        write_result(workdir, key, {"status": "ok"})
        os._exit(0)
    if spec["role"] == "reference":
        from reward_svc.harness.reference import run_reference

        result = run_reference(spec, workdir)
    else:
        from reward_svc.harness.candidate import run_candidate

        result = run_candidate(spec, workdir)  # its trials' outputs are written by now, each with its fingerprint
    write_result(workdir, key, result)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no finalizers: nothing the candidate left behind runs after its result is written


if __name__ == "__main__":
    main()
