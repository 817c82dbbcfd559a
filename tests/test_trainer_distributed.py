"""The Coder's step scales past one process through accelerate: two CPU processes (torchrun, gloo) each take
half of the groups, and the gradients they average and the loss they report are one process's on all
of them (the token normalisation spans every process)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainer.tiny_model import build_tiny_lm

SCRIPT = Path(__file__).with_name("distributed_step.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _step(model: Path, out: Path, processes: int) -> dict:  # type: ignore[type-arg]
    # torchrun, what accelerate's multi-GPU launch runs; on CPU, accelerate then picks gloo
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes), "--nnodes", "1"]
    launch += ["--master_addr", "127.0.0.1", "--master_port", str(_free_port())]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SCRIPT.parent), str(SCRIPT.parent.parent)]),
        "GLOO_SOCKET_IFNAME": "lo",
        "ACCELERATE_USE_CPU": "true",
    }
    run = subprocess.run([*launch, str(SCRIPT), str(model), str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return torch.load(out)


@pytest.mark.slow  # three interpreters with torch and transformers
def test_two_processes_get_one_process_gradients_and_loss(tmp_path: Path) -> None:
    model = build_tiny_lm(tmp_path / "tiny")
    one = _step(model, tmp_path / "one.pt", 1)
    two = _step(model, tmp_path / "two.pt", 2)
    assert (one["processes"], two["processes"]) == (1, 2)
    assert two["loss"] == pytest.approx(one["loss"], rel=1e-5, abs=1e-7)
    assert one["grads"].keys() == two["grads"].keys() and one["grads"]
    for name, grad in one["grads"].items():
        torch.testing.assert_close(two["grads"][name], grad, rtol=1e-4, atol=1e-6, msg=name)
    assert any(float(g.abs().sum()) > 0 for g in one["grads"].values())
