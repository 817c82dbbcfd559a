"""One optimizer step of the platform's policy trainer (``trainer.policy.PolicyTrainer``) against TRL's
``GRPOTrainer`` (``loss_type="dapo"``) on the same randomly initialised model and the same fixed batch:
step time and completion tokens per second, each the median over ``--steps`` steps after a warm-up,
and their ratio, in one run (a table, and JSON under ``--out``).

Both do what one update on a scored batch takes: a forward and backward per micro-batch (gradients
accumulated), the gradient clip, the optimizer step and the schedule's; neither samples (the platform's
rollouts come from the Coder's queue; TRL's generation is left out by calling its loss directly, as its
training loop does after generating). Both start from inputs already made and on the device: TRL's
generation makes its own, ours are made by ``PolicyTrainer.prepare`` (tokenising, padding, the copy to
the device), timed apart and reported beside the steps. Both models are held at once and the sides
take turns step by step, so a drift of the machine over the run weighs on both. Full fine-tune, AdamW,
bf16 on a GPU. ``--profile`` adds one profiled step per side: the top operators and kernels by self
device time, the operator counts that differ and the kernels whose time differs most.

    python benchmarks/trainer_step.py --size 0.5b --profile --out benchmarks/results/trainer_step_h200   # the H200
    python benchmarks/trainer_step.py --size tiny --steps 2                                               # a CPU check
    python benchmarks/trainer_step.py --size mid --steps 1 --prompt-tokens 64 --completion-tokens 128 --bf16 --profile
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
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
    # Qwen2.5-0.5B's layer width (hidden, MLP, heads) with 2 layers and a smaller vocabulary: the
    # same shapes per layer on a CPU, in seconds rather than minutes.
    "mid": {
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 2,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "vocab_size": 8192,
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


def _synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed_in_turns(steps: dict[str, Callable[[], object]], rounds: int, device: str) -> dict[str, list[float]]:
    """Seconds per step of each side, the sides taking turns (each round in the reverse order of the
    last), so that a drift of the machine over the run (clocks, heat, the allocator's state, other
    work) weighs on every side alike; the first round (warm-up: allocation, kernels' first launch and
    compilation) left out."""
    seconds: dict[str, list[float]] = {name: [] for name in steps}
    order = list(steps)
    for _ in range(rounds + 1):
        for name in order:
            _synchronize(device)
            started = time.perf_counter()
            steps[name]()
            _synchronize(device)
            seconds[name].append(time.perf_counter() - started)
        order.reverse()
    return {name: values[1:] for name, values in seconds.items()}


def host_seconds(work: Callable[[], object], repeats: int) -> list[float]:
    """Seconds per call of host-side work (no device time waited for), the first call left out."""
    seconds = []
    for _ in range(repeats + 1):
        started = time.perf_counter()
        work()
        seconds.append(time.perf_counter() - started)
    return seconds[1:]


@dataclass(frozen=True)
class Side:
    """One trainer's optimizer step on inputs already made and on the device (TRL's are made by its
    generation, which is left out; ours by ``PolicyTrainer.prepare``, timed apart as ``prepare``)."""

    step: Callable[[], object]
    prepare: Callable[[], object] | None = None


def ours(model_dir: Path, prompts: list[str], batch: dict[str, torch.Tensor], args: argparse.Namespace) -> Side:
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
        bf16=args.bf16,
    )
    trainer = PolicyTrainer(config, total_steps=args.steps + 2)
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
    prepared = trainer.prepare(groups)
    return Side(step=lambda: trainer.step(prepared), prepare=lambda: trainer.prepare(groups))


def _no_reward(completions: list[Any], **_: Any) -> list[float | None]:
    return [0.0] * len(completions)  # never called: the batch comes scored


def trl(model_dir: Path, batch: dict[str, torch.Tensor], args: argparse.Namespace, out: Path) -> Side:
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
        bf16=args.bf16,
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
    trainer.create_optimizer_and_scheduler(num_training_steps=args.steps + 2)
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
        trainer.lr_scheduler.step()
        optimizer.zero_grad(set_to_none=True)

    return Side(step=step)


# The operators whose counts and shapes say what work a step does: projections, attention, the
# log-probabilities, dtype casts and copies, host syncs and the optimizer. Their (name, input shapes)
# rows go into the profile; every operator's count goes in by name.
WORK_OPS = (
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::matmul",
    "aten::linear",
    "aten::scaled_dot_product_attention",
    "aten::_scaled_dot_product_flash_attention",
    "aten::_scaled_dot_product_efficient_attention",
    "aten::_scaled_dot_product_cudnn_attention",
    "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::_to_copy",
    "aten::copy_",
    "aten::_local_scalar_dense",
    "aten::nonzero",
    "aten::index",
    "aten::masked_scatter",
    "aten::_fused_adamw_",
    "aten::_foreach_norm",
)


def profiled(step: Callable[[], object], device: str, rows: int) -> tuple[dict[str, Any], str]:
    """One more step under ``torch.profiler`` (host operators, and the GPU's kernels on a GPU): every
    operator's count and self time, the ``WORK_OPS`` rows by input shape, and a printable table of the
    top ``rows`` by self device time (self CPU time on the CPU)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    if device == "cuda":
        torch.cuda.synchronize()
    with profile(activities=activities, record_shapes=True) as profiler:
        step()
        if device == "cuda":
            torch.cuda.synchronize()
    by_name = profiler.key_averages()
    ops = {
        event.key: {
            "count": event.count,
            "self_cpu_ms": round(event.self_cpu_time_total / 1e3, 3),
            "self_device_ms": round(event.self_device_time_total / 1e3, 3),
        }
        for event in by_name
    }
    shapes = [
        {
            "op": event.key,
            "shapes": str(event.input_shapes),
            "count": event.count,
            "self_device_ms": round(event.self_device_time_total / 1e3, 3),
        }
        for event in profiler.key_averages(group_by_input_shape=True)
        if event.key in WORK_OPS
    ]
    sort_by = "self_device_time_total" if device == "cuda" else "self_cpu_time_total"
    table = by_name.table(sort_by=sort_by, row_limit=rows, max_name_column_width=90)
    return {"ops": ops, "work_op_shapes": sorted(shapes, key=lambda r: (r["op"], r["shapes"]))}, table


def side_by_side(profiles: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Every operator and kernel either side ran in its profiled step: its count and self device time on each."""
    ours, trl = profiles["ours"]["ops"], profiles["trl"]["ops"]
    return [
        {
            "op": name,
            "ours_count": ours.get(name, {}).get("count", 0),
            "trl_count": trl.get(name, {}).get("count", 0),
            "ours_ms": ours.get(name, {}).get("self_device_ms", 0.0),
            "trl_ms": trl.get(name, {}).get("self_device_ms", 0.0),
        }
        for name in sorted(set(ours) | set(trl))
    ]


def count_differences(profiles: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The operators each side runs a different number of times in a step, most different first."""
    rows = [r for r in side_by_side(profiles) if r["ours_count"] != r["trl_count"]]
    return sorted(rows, key=lambda r: -abs(r["ours_count"] - r["trl_count"]))


def device_time_differences(profiles: dict[str, dict[str, Any]], rows: int) -> list[dict[str, Any]]:
    """The operators and kernels whose self device time differs most between the sides (on a GPU: where
    the gap between the two step times is spent)."""
    deltas = [r for r in side_by_side(profiles) if r["ours_ms"] != r["trl_ms"]]
    return sorted(deltas, key=lambda d: -abs(d["ours_ms"] - d["trl_ms"]))[:rows]


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
    parser.add_argument(
        "--bf16", action=argparse.BooleanOptionalAction, default=None, help="bf16 autocast on both sides (default: on a GPU)."
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="After the timed steps, one more step per side under torch.profiler: trainer_step_profile.json "
        "(operator counts, the work operators' shapes, the counts that differ) and trainer_step_profile.txt "
        "(each side's top operators and kernels by self device time, self CPU time on the CPU).",
    )
    parser.add_argument("--profile-rows", type=int, default=40, help="Rows of each side's table in trainer_step_profile.txt.")
    parser.add_argument("--only", choices=["ours", "trl"], default=None, help="Run one side only (no ratio).")
    parser.add_argument("--out", type=Path, default=Path("trainer-step"), help="Where trainer_step.json goes.")
    parser.add_argument("--model-dir", type=Path, default=None, help="Where the random model is saved (default: OUT/model).")
    args = parser.parse_args()
    args.bf16 = args.device == "cuda" if args.bf16 is None else args.bf16
    args.out.mkdir(parents=True, exist_ok=True)
    model_dir = build_model(args.model_dir or args.out / "model", args.size, args.seed)
    prompts, batch = fixed_batch(args, model_dir, SIZES[args.size]["vocab_size"])
    tokens = int(batch["completion_mask"].sum())
    makers = {"ours": lambda: ours(model_dir, prompts, batch, args), "trl": lambda: trl(model_dir, batch, args, args.out)}
    sides = {name: make() for name, make in makers.items() if args.only in (None, name)}
    results = timed_in_turns({name: side.step for name, side in sides.items()}, args.steps, args.device)
    preparation = {name: host_seconds(side.prepare, args.steps) for name, side in sides.items() if side.prepare is not None}
    profiles: dict[str, dict[str, Any]] = {}
    tables: list[str] = []
    if args.profile:
        for name, side in sides.items():
            profiles[name], table = profiled(side.step, args.device, args.profile_rows)
            clock = "device" if args.device == "cuda" else "CPU"
            tables.append(f"=== {name}: one step, top {args.profile_rows} by self {clock} time\n{table}")
    medians = {name: statistics.median(seconds) for name, seconds in results.items()}
    table = Table("trainer", "median step s", "completion tokens/s", "steps")
    for name, seconds in results.items():
        table.add_row(name, f"{medians[name]:.3f}", f"{tokens / medians[name]:.0f}", str(len(seconds)))
    for name, seconds in preparation.items():
        table.add_row(
            f"{name}: input preparation (host, not in the step)", f"{statistics.median(seconds):.3f}", "", str(len(seconds))
        )
    Console().print(table)
    ratio = medians["trl"] / medians["ours"] if len(medians) == 2 else None
    if ratio is not None:
        print(f"TRL's step time / ours: {ratio:.2f} (above 1: ours is faster)")
    record = {
        **vars(args),
        "out": str(args.out),
        "model_dir": str(model_dir),
        "completion_tokens_in_step": tokens,
        "seconds": results,
        "preparation_seconds": preparation,
        "ratio": ratio,
    }
    (args.out / "trainer_step.json").write_text(json.dumps(record, indent=2))
    if profiles:
        differences = count_differences(profiles) if len(profiles) == 2 else []
        lines = [f"{'operator':90} {'ours':>7} {'trl':>7}"] + [
            f"{d['op'][:90]:90} {d['ours_count']:>7} {d['trl_count']:>7}" for d in differences
        ]
        tables.append("=== operators run a different number of times in one step\n" + "\n".join(lines))
        device_deltas = (
            device_time_differences(profiles, args.profile_rows) if len(profiles) == 2 and args.device == "cuda" else []
        )
        if device_deltas:
            lines = [f"{'operator or kernel':90} {'ours ms':>9} {'trl ms':>9} {'ours n':>7} {'trl n':>7}"] + [
                f"{d['op'][:90]:90} {d['ours_ms']:>9.2f} {d['trl_ms']:>9.2f} {d['ours_count']:>7} {d['trl_count']:>7}"
                for d in device_deltas
            ]
            tables.append("=== self device time that differs most between the sides, one step\n" + "\n".join(lines))
        (args.out / "trainer_step_profile.txt").write_text("\n\n".join(tables) + "\n")
        summary = {**profiles, "count_differences": differences, "device_time_differences": device_deltas}
        (args.out / "trainer_step_profile.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
