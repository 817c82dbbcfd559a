"""``kernelzero ci`` against a running Coder and reward service (the template generator, CPU, Triton's
interpreter): the exit codes of a met and a missed bar, the kernel and the summary written next to the
module, and the example GitHub Actions workflow's own command line."""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import yaml

from reward_cases import RELU_REFERENCE

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / "docs" / "examples" / "kernelzero-ci.yml"


def kernelzero_ci(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kernelzero", "ci", *args], capture_output=True, text=True, timeout=400)


def workflow_command() -> list[str]:
    """The ``kernelzero ci`` line of the example workflow, as its shell would split it."""
    steps = yaml.safe_load(WORKFLOW.read_text())["jobs"]["kernel"]["steps"]
    [line] = [step["run"] for step in steps if step.get("run", "").startswith("kernelzero ci ")]
    return shlex.split(line)


def test_met_and_missed_bars_exit_0_and_1_with_the_kernel_and_summary_beside_the_module(coder_api: str, tmp_path: Path) -> None:
    module = tmp_path / "relu.py"
    module.write_text(RELU_REFERENCE)

    met = kernelzero_ci(str(module), "--url", coder_api, "--device", "cpu", "-n", "1")
    assert met.returncode == 0, met.stderr[-3000:]
    kernel, summary = tmp_path / "relu_kernelzero.py", tmp_path / "relu_kernelzero.md"
    assert met.stdout.split() == [str(kernel), str(summary)]
    assert "@triton.jit" in kernel.read_text() and "class ModelNew" in kernel.read_text()
    assert "**Bar met**" in summary.read_text() and "| 0 (best) | correct |" in summary.read_text()

    # The example workflow's command, pointed here: on CPU no speedup is measured, so its 1.2x bar is missed.
    command = workflow_command()
    assert command[:3] == ["kernelzero", "ci", "models/fused_block.py"]
    arguments = [
        str(module) if a == "models/fused_block.py" else coder_api if "KERNELZERO_CODER_URL" in a else "cpu" if a == "cuda" else a
        for a in command[2:]
    ]
    missed = kernelzero_ci(*arguments)
    assert missed.returncode == 1, missed.stderr[-3000:]
    assert "no speedup measured" in " ".join(missed.stderr.split())
    assert "**Bar missed**" in summary.read_text() and "the bar 1.2x is not shown" in summary.read_text()

    # No verified kernel at all: the template writes Triton only, so every CUDA candidate is declined.
    kernel.unlink()
    declined = kernelzero_ci(str(module), "--url", coder_api, "--backend", "cuda", "--device", "cpu", "-n", "1")
    assert declined.returncode == 1, declined.stderr[-3000:]
    assert not kernel.exists()
    assert "| 0 | declined |" in summary.read_text() and "Triton only" in summary.read_text()


def test_no_platform_and_a_refused_module_exit_2_with_the_reason(
    tmp_path: Path, free_port: Callable[[], int], kz_env: Callable[..., object]
) -> None:
    kz_env(api_key="kz_none")
    module = tmp_path / "relu.py"
    module.write_text(RELU_REFERENCE)
    down = kernelzero_ci(str(module), "--url", f"http://127.0.0.1:{free_port()}", "--timeout", "5")
    assert down.returncode == 2 and "ConnectError" in down.stderr
    module.write_text("print('not a KernelBench module')\n")
    refused = kernelzero_ci(str(module), "--url", f"http://127.0.0.1:{free_port()}")
    assert refused.returncode == 2 and "must define Model and get_inputs" in " ".join(refused.stderr.split())
