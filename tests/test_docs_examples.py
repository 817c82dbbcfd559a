"""docs/INTEGRATIONS.md's examples, extracted and run as a user would paste them: each block marked
``<!-- example: NAME -->`` runs against a running reward service (and, for ``kernelzero ci``, a Coder);
a block that cannot run here says why (``<!-- not run: ... -->``). A change that breaks an example
breaks this test."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse

import pytest

from coder_svc import kernel_messages
from reward_cases import RELU_REFERENCE
from trainer.tiny_model import build_replying_lm

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "INTEGRATIONS.md"
RELU_KERNEL = (ROOT / "tests" / "kernels" / "relu" / "triton_correct.py").read_text()
EXAMPLES = {"sdk", "trl", "verl", "openrlhf", "kernelbench", "ci"}


def marked_blocks(text: str) -> dict[str, tuple[str, str]]:
    """Every fenced block, by its marker (``example: NAME`` or ``not run: why``): (language, code).
    A block without a marker fails: each one is either run or says why not."""
    blocks: dict[str, tuple[str, str]] = {}
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("```"):
            marker = lines[i - 1].strip() if i else ""
            assert marker.startswith("<!-- ") and marker.endswith(" -->"), f"line {i + 1}: a block with no marker above it"
            end = lines.index("```", i + 1)
            key = marker[5:-4]
            blocks[key.removeprefix("example: ") if key.startswith("example: ") else f"{key} #{i + 1}"] = (
                lines[i][3:].strip(),
                "\n".join(lines[i + 1 : end]) + "\n",
            )
            i = end
        i += 1
    return blocks


BLOCKS = marked_blocks(DOC.read_text())


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A user's directory: the module and a kernel for it, and a home with the key ``kernelzero up`` leaves."""
    (tmp_path / "model.py").write_text(RELU_REFERENCE)
    (tmp_path / "kernel.py").write_text(RELU_KERNEL)
    (tmp_path / "home" / ".kernelzero").mkdir(parents=True)
    (tmp_path / "home" / ".kernelzero" / "api-key").write_text("kz_unused_auth_is_off\n")
    return tmp_path


def user_env(workdir: Path, **settings: object) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KZ_")}
    env |= {f"KZ_{k.upper()}": str(v) for k, v in settings.items()}
    env["HOME"] = str(workdir / "home")
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])  # an activated .venv
    return env


def run_example(name: str, workdir: Path, env: dict[str, str], replace: dict[str, str] | None = None) -> str:
    language, code = BLOCKS[name]
    for old, new in (replace or {}).items():
        assert old in code, f"the {name} example no longer has {old!r} for the test to swap"
        code = code.replace(old, new)
    command = [sys.executable, "-c", code] if language == "python" else ["bash", "-e", "-o", "pipefail", "-c", code]
    run = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, f"{name}:\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}"
    return run.stdout


def reward_env(reward_service: str, workdir: Path) -> dict[str, str]:
    url = urlparse(reward_service)
    return user_env(workdir, host=url.hostname, reward_port=url.port, data_dir=workdir / "data")


def test_every_block_is_an_example_or_says_why_not() -> None:
    assert {name for name in BLOCKS if "#" not in name} == EXAMPLES
    assert all(name.startswith("not run: ") for name in BLOCKS if "#" in name)


def test_sdk_example(reward_service: str, workdir: Path) -> None:
    out = run_example("sdk", workdir, reward_env(reward_service, workdir)).splitlines()
    assert out[0].startswith("correct 1.0 ") and out[1].startswith("incorrect 0.0 ")
    assert out[2:] == ["404 no job with id no-such-job", "correct"]


def test_verl_example_prints_what_its_comment_says(reward_service: str, workdir: Path) -> None:
    out = run_example("verl", workdir, reward_env(reward_service, workdir))
    promised = BLOCKS["verl"][1].rsplit("# ", 1)[1].strip()
    assert ast.literal_eval(out.strip()) == ast.literal_eval(promised)


def test_openrlhf_example(reward_service: str, workdir: Path) -> None:
    url = urlparse(reward_service)
    out = run_example("openrlhf", workdir, reward_env(reward_service, workdir), {"localhost:8103": f"{url.hostname}:{url.port}"})
    answer = json.loads(out)
    assert answer["rewards"] == [1.0] and answer["scores"] == [1.0] and answer["extra_logs"]["scored"] == [1.0]


def test_kernelbench_example(reward_service: str, workdir: Path) -> None:
    out = run_example("kernelbench", workdir, reward_env(reward_service, workdir))
    assert out.startswith("True True -1.0 ")  # CPU: correct, no runtime measured


def test_trl_example(reward_service: str, workdir: Path) -> None:
    tiny = build_replying_lm(workdir / "tiny-lm", kernel_messages(RELU_REFERENCE, "triton"), f"```python\n{RELU_KERNEL}```")
    # a tiny model, one step, on this CPU: what the example would do on a GPU in 200
    replace = {"Qwen/Qwen2.5-Coder-7B-Instruct": str(tiny), "max_steps=200": "max_steps=1, use_cpu=True, bf16=False"}
    out = run_example("trl", workdir, reward_env(reward_service, workdir), replace)
    assert "'train_runtime'" in out


def test_ci_example(coder_api: str, workdir: Path, kz_env: Callable[..., object]) -> None:
    settings = {k.removeprefix("KZ_").lower(): v for k, v in os.environ.items() if k.startswith("KZ_")}  # coder_api's
    out = run_example("ci", workdir, user_env(workdir, **settings))
    assert "bar missed: exit 1" in out  # CPU: no speedup measured, so a 1.2x bar is not shown
    assert "**Bar missed**" in out and "| correct |" in out
    assert (workdir / "model_kernelzero.py").exists()
