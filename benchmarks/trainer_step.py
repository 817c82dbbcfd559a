"""One optimizer step of the platform's policy trainer (``trainer.policy.PolicyTrainer``) against TRL's
``GRPOTrainer`` (``loss_type="dapo"``) on the same randomly initialised model and the same fixed batch:
step time and completion tokens per second, each the median over ``--steps`` steps after a warm-up,
and their ratio, in one run (a table, and JSON under ``--out``).

Both do what one update on a scored batch takes: a forward and backward per micro-batch (gradients
accumulated), the gradient clip and the optimizer step; neither samples (the platform's rollouts come
from the Coder's queue; TRL's generation is left out by calling its loss directly, as its training loop
does after generating). Full fine-tune, AdamW, bf16 on a GPU.

    python benchmarks/trainer_step.py --size 0.5b --out benchmarks/results/trainer_step_h200   # the H200
    python benchmarks/trainer_step.py --size tiny --steps 2                                     # a CPU check
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

# Qwen2 configurations, randomly initialised: "0.5b" has Qwen2.5-0.5B's shape (about 494M parameters).
SIZES: dict[str, dict[str, Any]] = {
    "0.5b": {
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
    },
    "tiny": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 1024,
        "tie_word_embeddings": True,
    },
}


def build_model(directory: Path, size: str, seed: int) -> Path:
    """A random Qwen2 model and a tokenizer made offline, saved where both trainers load them from."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from trainer.tiny_model import build_tokenizer

    tokenizer = build_tokenizer(directory, vocab_size=400)
    torch.manual_seed(seed)
    config = Qwen2Config(
        **SIZES[size],
        max_position_embeddings=32768,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    Qwen2ForCausalLM(config).save_pretrained(directory)
    return directory


def fixed_batch(args: argparse.Namespace, model_dir: Path, vocab: int) -> tuple[list[str], dict[str, torch.Tensor]]:
    """``groups × group_size`` sequences: a prompt text per group that tokenises to at least
    ``prompt_tokens`` (both trainers keep its last ``prompt_tokens``), completions of a length drawn
    between half and all of ``completion_tokens`` (the rest padding), advantages of both signs."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    generator = torch.Generator().manual_seed(args.seed)
    n = args.groups * args.group_size
    texts = [
        tokenizer.decode(torch.randint(5, len(tokenizer), (4 * args.prompt_tokens,), generator=generator).tolist())
        for _ in range(args.groups)
    ]
    prompt_ids = [tokenizer(t, add_special_tokens=False)["input_ids"][-args.prompt_tokens :] for t in texts]
    assert all(len(ids) == args.prompt_tokens for ids in prompt_ids), "a prompt text shorter than --prompt-tokens"
    lengths = torch.randint(args.completion_tokens // 2, args.completion_tokens + 1, (n,), generator=generator)
    mask = (torch.arange(args.completion_tokens)[None, :] < lengths[:, None]).long()
    return [texts[i // args.group_size] for i in range(n)], {
        "prompt_ids": torch.tensor([prompt_ids[i // args.group_size] for i in range(n)]),
        "completion_ids": torch.randint(5, vocab, (n, args.completion_tokens), generator=generator) * mask,
        "completion_mask": mask,
        "advantages": torch.randn(n, generator=generator),
    }


def timed(step: Callable[[], object], steps: int, device: str) -> list[float]:
    """Seconds per step, the first (warm-up: allocation, kernels' first launch) left out."""
    seconds = []
    for _ in range(steps + 1):
        if device == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        step()
        if device == "cuda":
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - started)
    return seconds[1:]


def ours(model_dir: Path, prompts: list[str], batch: dict[str, torch.Tensor], args: argparse.Namespace) -> list[float]:
    from trainer.config import PolicyRLConfig
    from trainer.policy import PolicyTrainer
    from trainer.rollouts import ClaimedGroup, ClaimedSample

    config = PolicyRLConfig(
        model_path=model_dir,
        lora=None,
        group_size=args.group_size,
        groups_per_step=args.groups,
        micro_batch_size=args.micro_batch,
        importance_cap=None,
        max_prompt_tokens=args.prompt_tokens,
        max_completion_tokens=args.completion_tokens,
        learning_rate=1e-6,
    )
    trainer = PolicyTrainer(config, total_steps=args.steps + 1)
    lengths = batch["completion_mask"].sum(1).tolist()
    samples = [
        ClaimedSample(
            prompt=prompts[i],
            completion="",
            completion_ids=batch["completion_ids"][i, : lengths[i]].tolist(),
            behaviour_logps=None,
            reward=0.0,
            advantage=float(batch["advantages"][i]),
        )
        for i in range(len(lengths))
    ]
    groups = [ClaimedGroup(f"g{g}", None, samples[g * args.group_size : (g + 1) * args.group_size]) for g in range(args.groups)]
    return timed(lambda: trainer.step(groups), args.steps, args.device)


def _no_reward(completions: list[Any], **_: Any) -> list[float | None]:
    return [0.0] * len(completions)  # never called: the batch comes scored


def trl(model_dir: Path, batch: dict[str, torch.Tensor], args: argparse.Namespace, out: Path) -> list[float]:
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    n = len(batch["advantages"])
    micro_batches = n // args.micro_batch
    config = GRPOConfig(
        output_dir=str(out / "trl"),
        loss_type="dapo",
        beta=0.0,
        epsilon=0.2,
        epsilon_high=0.28,
        per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=micro_batches,
        num_generations=args.group_size,
        max_completion_length=args.completion_tokens,
        learning_rate=1e-6,
        max_grad_norm=1.0,
        bf16=args.device == "cuda",
        use_cpu=args.device == "cpu",
        report_to="none",
    )
    trainer = GRPOTrainer(
        model=str(model_dir),
        reward_funcs=_no_reward,
        args=config,
        train_dataset=Dataset.from_dict({"prompt": ["x"] * n}),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
    )
    trainer.create_optimizer_and_scheduler(num_training_steps=args.steps + 1)
    model, optimizer = trainer.accelerator.prepare(trainer.model, trainer.optimizer)
    model.train()
    trainer.current_gradient_accumulation_steps = micro_batches
    device = trainer.accelerator.device
    items = batch["completion_mask"].sum().to(device)
    slices = [
        {
            "prompt_ids": batch["prompt_ids"][i : i + args.micro_batch].to(device),
            "prompt_mask": torch.ones_like(batch["prompt_ids"][i : i + args.micro_batch]).to(device),
            "completion_ids": batch["completion_ids"][i : i + args.micro_batch].to(device),
            "completion_mask": batch["completion_mask"][i : i + args.micro_batch].to(device),
            "advantages": batch["advantages"][i : i + args.micro_batch].to(device),
            "num_items_in_batch": items,
        }
        for i in range(0, n, args.micro_batch)
    ]

    def step() -> None:  # what Trainer's loop does per optimizer step once the inputs are made
        for inputs in slices:
            with trainer.compute_loss_context_manager():
                loss = trainer.compute_loss(model, inputs)
            trainer.accelerator.backward(loss)
        trainer.accelerator.clip_grad_norm_(model.parameters(), config.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return timed(step, args.steps, args.device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="0.5b")
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--completion-tokens", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, default=Path("trainer-step"), help="Where trainer_step.json goes.")
    parser.add_argument("--model-dir", type=Path, default=None, help="Where the random model is saved (default: OUT/model).")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model_dir = build_model(args.model_dir or args.out / "model", args.size, args.seed)
    prompts, batch = fixed_batch(args, model_dir, SIZES[args.size]["vocab_size"])
    tokens = int(batch["completion_mask"].sum())
    results = {"ours": ours(model_dir, prompts, batch, args)}
    if args.device == "cuda":
        torch.cuda.empty_cache()
    results["trl"] = trl(model_dir, batch, args, args.out)
    medians = {name: statistics.median(seconds) for name, seconds in results.items()}
    table = Table("trainer", "median step s", "completion tokens/s", "steps")
    for name, seconds in results.items():
        table.add_row(name, f"{medians[name]:.3f}", f"{tokens / medians[name]:.0f}", str(len(seconds)))
    Console().print(table)
    ratio = medians["trl"] / medians["ours"]
    print(f"TRL's step time / ours: {ratio:.2f} (above 1: ours is faster)")
    record = {
        **vars(args),
        "out": str(args.out),
        "model_dir": str(model_dir),
        "completion_tokens_in_step": tokens,
        "seconds": results,
        "ratio": ratio,
    }
    (args.out / "trainer_step.json").write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
