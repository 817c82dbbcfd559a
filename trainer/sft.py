"""Cold-start SFT for the Coder: traces (a reply with its reasoning and its code) from a teacher — the
template generator, any OpenAI-compatible endpoint, or a user's JSONL — each kept only if the reward
service verified its kernel correct, deduplicated, then trained through TRL's ``SFTTrainer`` with the
loss on the completion only.

The prompt is the Coder's serving prompt (``coder_svc.kernel_messages``) rendered by the trained
model's own chat template (``render_prompt``, what the ``hf`` backend and vLLM render), so training
and serving see the same text. The template teacher writes code only; its trace states what it
fused and what it leaves to PyTorch before the code, the reasoning a reader of the kernel needs.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict
from rich.progress import Progress

from coder_svc import KernelBackend, KernelDraft, KernelGenerator, kernel_messages, system_prompt_for
from reward_svc import Evaluator
from services.llm.chat import Message, Sampling
from services.llm.extract import extract_code
from services.schemas.reward import ScoreOptions
from trainer.config import ColdStartConfig, bf16_enabled

TraceOrigin = Literal["template", "teacher", "jsonl"]


class Trace(BaseModel):
    """One verified example: the module, the serving prompt's messages, the reply to learn."""

    model_config = ConfigDict(frozen=True)

    module: str
    backend: KernelBackend = "triton"
    messages: list[Message]
    completion: str
    origin: TraceOrigin

    @property
    def key(self) -> str:
        """Two traces are one when the module and the code they teach are (the reply's wording aside)."""
        code = extract_code(self.completion) or self.completion
        return hashlib.sha256(f"{self.backend}\0{self.module}\0{code}".encode()).hexdigest()


Verify = Callable[[str, list[str], ScoreOptions], list[bool]]  # (module, sources, options) -> correct per source


def verifier(evaluator: Evaluator) -> Verify:
    """Verification in this machine's sandboxed children (the reward service's ``Evaluator``)."""

    def verify(module: str, sources: list[str], options: ScoreOptions) -> list[bool]:
        return [v.correct for v in evaluator.evaluate_group(module, sources, options).verdicts]

    return verify


def template_reply(draft: KernelDraft) -> str:
    """The template teacher's trace: what it fused and what stays in PyTorch, then the code."""
    kernels = draft.details.get("kernels") or []
    lines = [
        f"- a Triton kernel for {' + '.join(k['ops'])}" + (f" (a {k['reduction']} reduction)" if k.get("reduction") else "")
        for k in kernels
    ]
    left = draft.details.get("pytorch_ops") or []
    plan = "\n".join(lines) or "- one Triton kernel for the whole forward"
    rest = f"\nPyTorch keeps {', '.join(dict.fromkeys(left))}, which no kernel here would beat." if left else ""
    intro = "I fuse the forward's elementwise and reduction work into as few kernels as I can:"
    return f"{intro}\n{plan}{rest}\n\n```python\n{draft.source}\n```"


def collect(
    modules: Iterable[str],
    generator: KernelGenerator,
    verify: Verify,
    options: ScoreOptions,
    *,
    backend: KernelBackend = "triton",
    sampling: Sampling | None = None,
    progress: Progress | None = None,
) -> list[Trace]:
    """Every reply of ``generator`` on each module whose kernel ``verify`` finds correct, as a trace."""
    modules = list(modules)
    sampling = sampling or Sampling(n=1)
    origin: TraceOrigin = "template" if generator.name == "template" else "teacher"
    task = progress.add_task(f"traces from {generator.name}", total=len(modules)) if progress else None
    traces: list[Trace] = []
    for module in modules:
        drafts = [d for d in generator.generate(module, backend, sampling) if d.source is not None]
        verdicts = verify(module, [d.source for d in drafts if d.source is not None], options) if drafts else []
        for draft, correct in zip(drafts, verdicts):
            if correct:
                reply = template_reply(draft) if origin == "template" else draft.raw
                traces.append(
                    Trace(module=module, backend=backend, messages=_messages(module, backend), completion=reply, origin=origin)
                )
        if progress is not None and task is not None:
            progress.advance(task)
    return traces


def read_jsonl(path: Path, verify: Verify, options: ScoreOptions) -> tuple[list[Trace], list[str]]:
    """A user's traces, one JSON object a line: ``module``, ``completion`` (the reply, with its code) and
    optionally ``backend``; each kept only where its code verifies. Also why each other line was left out."""
    traces, refused = [], []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            module, completion = str(data["module"]), str(data["completion"])
            backend = data.get("backend", "triton")
            if backend not in get_args(KernelBackend):
                raise ValueError(f"backend {backend!r} is not one of {', '.join(get_args(KernelBackend))}")
            trace = Trace(
                module=module, backend=backend, messages=_messages(module, backend), completion=completion, origin="jsonl"
            )
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:  # ValidationError is a ValueError
            refused.append(f"line {number}: not a trace ({type(exc).__name__}: {str(exc)[:120]})")
            continue
        source = extract_code(completion)
        if source is None:
            refused.append(f"line {number}: the completion holds no program defining ModelNew")
        elif not verify(module, [source], options.model_copy(update={"backend": backend}))[0]:
            refused.append(f"line {number}: its kernel is not correct")
        else:
            traces.append(trace)
    return traces, refused


def deduplicate(traces: Iterable[Trace]) -> list[Trace]:
    """The first trace of each (module, code) pair, in order."""
    seen: dict[str, Trace] = {}
    for trace in traces:
        seen.setdefault(trace.key, trace)
    return list(seen.values())


def write_jsonl(traces: Iterable[Trace], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "".join(json.dumps({"module": t.module, "backend": t.backend, "completion": t.completion}) + "\n" for t in traces)
    )


@dataclass(frozen=True)
class Gathered:
    """The traces kept for training, the JSONL lines left out (with why) and how many were duplicates."""

    traces: list[Trace]
    refused: list[str]
    duplicates: int


def gather(
    modules: Iterable[str],
    jsonl: Path | None,
    generator: KernelGenerator,
    verify: Verify,
    options: ScoreOptions,
    *,
    progress: Progress | None = None,
) -> Gathered:
    """The teacher's verified traces on ``modules``, then a user's verified ones, each (module, code)
    once: what ``kernelzero train cold-start`` trains on."""
    found = collect(modules, generator, verify, options, progress=progress)
    refused: list[str] = []
    if jsonl is not None:
        read, refused = read_jsonl(jsonl, verify, options)
        found += read
    kept = deduplicate(found)
    return Gathered(kept, refused, len(found) - len(kept))


def _messages(module: str, backend: KernelBackend) -> list[Message]:
    return kernel_messages(module, backend, system_prompt_for(backend))


def sft_dataset(traces: list[Trace], tokenizer: Any) -> Any:
    """TRL's prompt-completion form with the prompt as text, rendered as serving renders it."""
    from datasets import Dataset

    from services.llm.hf_local import render_prompt

    rows = [{"prompt": render_prompt(tokenizer, t.messages), "completion": t.completion} for t in traces]
    return Dataset.from_list(rows)


def train(traces: list[Trace], config: ColdStartConfig, output_dir: Path) -> Path:
    """SFT through TRL's ``SFTTrainer``; the adapter (or model) and tokenizer saved to ``output_dir``."""
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    if not traces:
        raise ValueError("no verified trace to train on")
    config.check()
    tokenizer = AutoTokenizer.from_pretrained(config.model_path)
    args = SFTConfig(
        output_dir=str(output_dir),
        learning_rate=config.learning_rate,
        num_train_epochs=config.epochs,
        max_steps=config.max_steps,
        per_device_train_batch_size=config.batch_size,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        max_length=config.max_length,
        completion_only_loss=True,
        bf16=bf16_enabled(config.bf16),
        seed=config.seed,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
    )
    trainer = SFTTrainer(
        model=str(config.model_path),
        args=args,
        train_dataset=sft_dataset(traces, tokenizer),
        processing_class=tokenizer,
        peft_config=config.lora.to_peft() if config.lora is not None else None,
    )
    trainer.train()
    trainer.save_model(str(output_dir))
    tokenizer.save_pretrained(output_dir)
    return output_dir
