"""What the template generator's tests share: a small KernelBench-format module, and a check script run
on a draft under the Triton interpreter in its own process."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from coder_svc.drafts import KernelDraft
from coder_svc.template import TemplateGenerator
from reward_svc.evaluate import Evaluator
from services.llm.chat import Sampling
from services.schemas.reward import ScoreOptions

HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\n"


def problem(init: str, forward: str, inputs: str, init_inputs: str = "[]") -> str:
    """A module whose ``__init__`` and ``forward(self, x)`` bodies (indented) are given."""
    return (
        HEADER
        + f"""class Model(nn.Module):
    def __init__(self, *args):
        super().__init__()
{init}

    def forward(self, x):
{forward}


def get_inputs():
    return {inputs}


def get_init_inputs():
    return {init_inputs}
"""
    )


def assert_check_passes(draft: KernelDraft, check: str, workdir: Path) -> None:
    """Run ``check`` (a script given the draft's file as its argument, printing ``ok``) on the draft,
    interpreted: what scoring cannot show (bits, training-mode state)."""
    assert draft.source, draft.declined
    (workdir / "candidate.py").write_text(draft.source)
    (workdir / "check.py").write_text(check)
    done = subprocess.run(
        [sys.executable, "check.py", "candidate.py"],
        cwd=workdir,
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def assert_writes_correct_kernels(
    generator: TemplateGenerator, evaluator: Evaluator, reference: str, left_to_pytorch: Callable[[dict[str, Any]], list[str]]
) -> None:
    """The template's draft for ``reference`` is scored correct on CPU, and none of the ops
    ``left_to_pytorch`` picks from its details' PyTorch ops (the family under test) stayed PyTorch's."""
    draft = generator.generate(reference, "triton", Sampling())[0]
    assert draft.declined is None and draft.source, draft.declined
    assert not left_to_pytorch(draft.details) and not draft.details["unsupported"], draft.details
    verdict = evaluator.evaluate_group(
        reference, [draft.source], ScoreOptions(backend="triton", device="cpu", timeout_s=300)
    ).verdicts[0]
    assert verdict.status == "correct", f"{verdict.status}: {verdict.reason}\n{draft.details}"
