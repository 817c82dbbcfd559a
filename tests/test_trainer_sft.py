"""Cold-start SFT: traces from the template teacher kept only where the sandboxed reward service finds
their kernels correct, a user's JSONL verified line by line (each refusal with its reason), duplicates
dropped, the prompt rendered exactly as serving renders it, and TRL's SFTTrainer making a tiny model
likelier to write the traces it was shown."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from coder_svc import build_generator
from reward_svc.evaluate import Evaluator
from services.config import Settings
from services.llm.hf_local import HFChatModel
from services.schemas.reward import ScoreOptions
from trainer.config import ColdStartConfig
from trainer.sft import Trace, collect, deduplicate, read_jsonl, sft_dataset, train, verifier, write_jsonl
from trainer.tiny_model import build_tiny_lm

CPU = ScoreOptions(backend="triton", device="cpu", timeout_s=120)


def module(forward: str, inputs: str = "[torch.randn(16, 64)]") -> str:
    return (
        "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def forward(self, x):\n"
        f"        return {forward}\n\n\ndef get_inputs():\n    return {inputs}\n\n\ndef get_init_inputs():\n    return []\n"
    )


MODULES = [module("torch.relu(x) * 2.0"), module("torch.softmax(x, dim=1)"), module("torch.sigmoid(x) + x")]
WRONG_RELU = "```python\nimport torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return x * 2.0\n```"


@pytest.fixture(scope="module")
def traces(shared_evaluator: Evaluator) -> list[Trace]:
    return collect(MODULES, build_generator("template"), verifier(shared_evaluator), CPU)


@pytest.mark.slow  # the template's tracer and the sandboxed reward
def test_template_traces_are_verified_and_in_the_serving_prompt(traces: list[Trace]) -> None:
    assert len(traces) == len(MODULES)
    for trace, source in zip(traces, MODULES):
        assert trace.module == source and trace.origin == "template"
        assert trace.messages[-1]["content"].count(source.strip()) == 1  # the Coder's own prompt around the module
        assert "```python" in trace.completion and "@triton.jit" in trace.completion and "Triton kernel" in trace.completion
    assert deduplicate([*traces, *traces]) == traces


@pytest.mark.slow
def test_a_users_jsonl_keeps_only_what_verifies_and_says_why(
    traces: list[Trace], shared_evaluator: Evaluator, tmp_path: Path
) -> None:
    path = tmp_path / "mine.jsonl"
    write_jsonl(traces[:1], path)
    with path.open("a") as f:
        f.write(json.dumps({"module": MODULES[0], "completion": WRONG_RELU}) + "\n")
        f.write(json.dumps({"module": MODULES[0], "completion": "I would fuse it."}) + "\n")
        f.write("not json\n\n")
        f.write(json.dumps({"module": MODULES[0], "completion": traces[0].completion, "backend": "metal"}) + "\n")
    kept, refused = read_jsonl(path, verifier(shared_evaluator), CPU)
    assert [t.completion for t in kept] == [traces[0].completion] and kept[0].origin == "jsonl"
    assert refused[:2] == ["line 2: its kernel is not correct", "line 3: the completion holds no program defining ModelNew"]
    assert refused[2].startswith("line 4: not a trace (JSONDecodeError")
    assert refused[3] == "line 6: not a trace (ValueError: backend 'metal' is not one of cuda, triton)" and len(refused) == 4


def completion_logprob(model_dir: Path, base: Path, prompt: str, completion: str) -> float:
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([prompt_ids + tokenizer(completion, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        logps = model(input_ids=ids).logits[0, :-1].log_softmax(-1).gather(1, ids[0, 1:, None])[:, 0]
    return float(logps[len(prompt_ids) - 1 :].mean())


@pytest.mark.slow  # a few TRL optimizer steps on CPU
def test_sft_through_trl_makes_the_traces_likelier(traces: list[Trace], tmp_path: Path) -> None:
    base = build_tiny_lm(tmp_path / "tiny")
    rows = sft_dataset(traces, AutoTokenizer.from_pretrained(base))
    assert rows[0]["prompt"] == HFChatModel(base).render(traces[0].messages)  # what serving renders, to the character
    config = ColdStartConfig(model_path=base, lora=None, learning_rate=5e-3, epochs=8, batch_size=2, max_length=4096, seed=0)
    out = train(traces, config, tmp_path / "sft")
    before = completion_logprob(base, base, rows[0]["prompt"], traces[0].completion)
    after = completion_logprob(out, base, rows[0]["prompt"], traces[0].completion)
    assert after > before + 0.5, (before, after)


@pytest.mark.slow  # a kernelzero process: the template's tracer, the sandboxed reward, TRL
def test_cold_start_command_verifies_trains_and_refuses_a_bad_config(kz_env: Callable[..., Settings], tmp_path: Path) -> None:
    kz_env(reward_warm_children=0)
    model_dir = build_tiny_lm(tmp_path / "tiny")
    problems = tmp_path / "problems"
    problems.mkdir()
    for number, source in enumerate(MODULES[:2], 1):
        (problems / f"{number}_module.py").write_text(source)
    user = tmp_path / "user.jsonl"
    user.write_text(json.dumps({"module": MODULES[0], "completion": WRONG_RELU}) + "\n")
    out = tmp_path / "run"
    command = [sys.executable, "-m", "kernelzero", "train", "cold-start", "--model-path", str(model_dir), "--out", str(out)]
    done = subprocess.run(
        [*command, "--problems", str(problems), "--traces", str(user), "--max-steps", "2", "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "line 1: its kernel is not correct" in done.stderr
    kept = [json.loads(line) for line in (out / "traces.jsonl").read_text().splitlines()]
    assert [t["module"] for t in kept] == MODULES[:2]  # the wrong kernel of the JSONL left out
    assert (out / "model" / "adapter_config.json").is_file()

    config = tmp_path / "run.yaml"
    config.write_text("lora:\n  target_modules: [qkv_proj]\n")
    refused = subprocess.run(
        [*command, "--problems", str(problems), "--config", str(config)], capture_output=True, text=True, timeout=120
    )
    assert refused.returncode == 1 and "config refused" in refused.stderr and "qkv_proj" in refused.stderr
    assert "Traceback" not in refused.stderr
    unpublished = subprocess.run(  # no Coder service answers here: refused before any work
        [*command, "--problems", str(problems), "--publish"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "KZ_CODER_PORT": "1"},
    )
    assert unpublished.returncode == 1 and "--publish needs the Coder service" in unpublished.stderr, unpublished.stderr[-2000:]
    assert "Traceback" not in unpublished.stderr
