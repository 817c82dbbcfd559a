"""One group-relative policy optimizer step on claimed rollout groups (the Coder's CA-GRPO, the
Proposer's GRPO: they differ only in their rewards), through accelerate (one process, DDP, FSDP or
DeepSpeed, as its config says) on a Hugging Face causal LM, LoRA through peft or every weight.

The rollouts were sampled elsewhere (the Coder's or the Proposer's queue, vLLM) and scored; this
step re-tokenises nothing it was given as ids and weighs each token by the truncated ratio to the
sampler's own log-probabilities where the sampler reported them. Each claimed batch makes one
update, so the clipped ratio's denominator is the policy's own log-probabilities, detached (TRL's
``num_iterations=1``): no second forward pass computes them.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from trainer.config import PolicyRLConfig, bf16_enabled
from trainer.loss import PolicyLoss, completion_logps, fuse_logps_head, policy_loss
from trainer.rollouts import ClaimedGroup, ClaimedSample

OPTIMIZER_FILE = "optimizer.pt"  # in a published version's directory: the AdamW moments it was trained with


@dataclass(frozen=True)
class StepReport:
    """What one optimizer step did, for the run's records and curves."""

    loss: float
    clip_fraction: float
    importance_weight: float | None
    kl: float | None
    grad_norm: float
    learning_rate: float
    reward_mean: float
    reward_std: float
    groups: int
    samples: int
    tokens: int
    seconds: float

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class _Sequence:
    prompt_ids: list[int]
    completion_ids: list[int]
    behaviour_logps: list[float] | None
    advantage: float


@dataclass(frozen=True)
class MicroBatch:
    """One forward/backward pass's sequences, padded and on the device."""

    tensors: dict[str, torch.Tensor]
    prompts_padded: bool  # some prompt is shorter than the longest, so left-padded: the model needs the attention mask


@dataclass(frozen=True)
class PreparedStep:
    """A step's groups tokenised and collated into micro-batches on the device (``PolicyTrainer.prepare``):
    the host's share of a step, done before any of the device's."""

    micro_batches: list[MicroBatch]
    rewards: list[float]
    groups: int
    tokens: int  # this process's completion tokens


class PolicyTrainer:
    """The policy being trained, its optimizer and schedule; ``step`` applies one update."""

    def __init__(
        self,
        config: PolicyRLConfig,
        accelerator: Any | None = None,
        *,
        total_steps: int = 1000,
        resume_from: Path | None = None,
        steps_done: int = 0,
    ) -> None:
        """``resume_from``: a version this run published (its adapter, or its whole model), trained on
        from there, with the optimizer's moments it saved beside the weights (``OPTIMIZER_FILE``; a
        version without them, a cold-start adapter, starts them afresh); ``steps_done`` moves the
        learning-rate schedule to where that version left it."""
        from accelerate import Accelerator
        from accelerate.utils import DistributedType
        from transformers import AutoModelForCausalLM, AutoTokenizer, get_scheduler

        self.config = config
        torch.manual_seed(config.seed)
        self.accelerator = accelerator or Accelerator(mixed_precision="bf16" if bf16_enabled(config.bf16) else "no")
        self.tokenizer = AutoTokenizer.from_pretrained(config.model_path)
        full_weights = resume_from if resume_from is not None and config.lora is None else config.model_path
        model: Any = fuse_logps_head(AutoModelForCausalLM.from_pretrained(full_weights), config.temperature)
        if config.lora is not None and resume_from is not None:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, resume_from, is_trainable=True)
        elif config.lora is not None:
            from peft import get_peft_model

            model = get_peft_model(model, config.lora.to_peft())
        # On one device or under DDP the model goes to its device first, so the optimizer can be the fused
        # AdamW (one kernel per step); FSDP and DeepSpeed place (and shard) it themselves.
        sharded = (DistributedType.FSDP, DistributedType.DEEPSPEED, DistributedType.MEGATRON_LM)
        placed_here = self.accelerator.distributed_type not in sharded
        if placed_here:
            model.to(self.accelerator.device)
        trainable = [p for p in model.parameters() if p.requires_grad]
        fused = placed_here and self.accelerator.device.type == "cuda"
        optimizer = torch.optim.AdamW(trainable, lr=config.learning_rate, weight_decay=config.weight_decay, fused=fused)
        moments = resume_from / OPTIMIZER_FILE if resume_from is not None else None
        if moments is not None and moments.is_file() and self._whole_optimizer_here():
            optimizer.load_state_dict(torch.load(moments, map_location="cpu", weights_only=True))
            for group in optimizer.param_groups:  # the schedule below sets the rate for ``steps_done``, from the config's
                group["lr"] = config.learning_rate
                group.pop("initial_lr", None)
        scheduler = get_scheduler(
            config.lr_scheduler, optimizer, num_warmup_steps=config.warmup_steps, num_training_steps=total_steps
        )
        with warnings.catch_warnings():  # moving the schedule to where the last version left it, before any step here
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` before")
            for _ in range(steps_done):
                scheduler.step()
        self.model, self.optimizer, self.scheduler = self.accelerator.prepare(model, optimizer, scheduler)
        self.reference: Any = None
        if config.beta:
            reference = AutoModelForCausalLM.from_pretrained(config.model_path)
            self.reference = fuse_logps_head(reference, config.temperature).eval().requires_grad_(False)
            self.reference = self.accelerator.prepare_model(self.reference, evaluation_mode=True)

    # -- inputs
    def _sequence(self, sample: ClaimedSample, prompt_ids: list[int]) -> _Sequence:
        completion_ids = sample.completion_ids or self.tokenizer(sample.completion, add_special_tokens=False)["input_ids"]
        behaviour = sample.behaviour_logps if sample.completion_ids and sample.behaviour_logps else None
        completion_ids = completion_ids[: self.config.max_completion_tokens]
        if behaviour is not None:
            behaviour = behaviour[: len(completion_ids)] if len(behaviour) >= len(completion_ids) else None
        return _Sequence(prompt_ids, list(completion_ids), behaviour, sample.advantage)

    def _prompt_ids(self, samples: list[ClaimedSample]) -> dict[str, list[int]]:
        """Each distinct prompt tokenised once (a group's samples share theirs), its last ``max_prompt_tokens``."""
        keep = self.config.max_prompt_tokens
        return {p: self.tokenizer(p, add_special_tokens=False)["input_ids"][-keep:] for p in {s.prompt for s in samples}}

    def _batch(self, sequences: list[_Sequence]) -> MicroBatch:
        """Prompts padded on the left, completions on the right, so every completion starts at one column."""
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        p_len = max(len(s.prompt_ids) for s in sequences)
        prompts_padded = any(len(s.prompt_ids) < p_len for s in sequences)
        c_len = max(max(len(s.completion_ids) for s in sequences), 1)
        device = self.accelerator.device

        def rows(values: Sequence[Sequence[float]], width: int, left: bool, fill: float, dtype: torch.dtype) -> torch.Tensor:
            padded = [([fill] * (width - len(v)) + list(v)) if left else (list(v) + [fill] * (width - len(v))) for v in values]
            return torch.tensor(padded, dtype=dtype, device=device)

        batch = {
            "prompt_ids": rows([s.prompt_ids for s in sequences], p_len, True, pad, torch.long),
            "prompt_mask": rows([[1] * len(s.prompt_ids) for s in sequences], p_len, True, 0, torch.long),
            "completion_ids": rows([s.completion_ids for s in sequences], c_len, False, pad, torch.long),
            "completion_mask": rows([[1] * len(s.completion_ids) for s in sequences], c_len, False, 0, torch.long),
            "advantages": torch.tensor([s.advantage for s in sequences], dtype=torch.float32, device=device),
        }
        if all(s.behaviour_logps is not None for s in sequences):
            batch["behaviour_logps"] = rows([s.behaviour_logps or [] for s in sequences], c_len, False, 0.0, torch.float32)
        return MicroBatch(batch, prompts_padded)

    def _logps(self, model: Any, batch: MicroBatch) -> torch.Tensor:
        return completion_logps(
            model,
            batch.tensors["prompt_ids"],
            batch.tensors["prompt_mask"],
            batch.tensors["completion_ids"],
            batch.tensors["completion_mask"],
            prompts_padded=batch.prompts_padded,
        )

    def prepare(self, groups: list[ClaimedGroup]) -> PreparedStep:
        """This process's groups tokenised (each distinct prompt once) and collated into micro-batches of
        ``micro_batch_size`` on the device. Within each group the samples go in order of completion
        length, so a micro-batch's completions are padded to a length near their own (fewer padding
        positions through the model) while its prompts stay one group's, unpadded; the loss is a sum
        over tokens, which the order does not change."""
        samples = [s for g in groups for s in g.samples]
        prompt_ids = self._prompt_ids(samples)
        sequences = [
            sequence
            for g in groups
            for sequence in sorted(
                (self._sequence(s, prompt_ids[s.prompt]) for s in g.samples), key=lambda q: len(q.completion_ids)
            )
        ]
        size = self.config.micro_batch_size
        return PreparedStep(
            micro_batches=[self._batch(sequences[i : i + size]) for i in range(0, len(sequences), size)],
            rewards=[s.reward for s in samples],
            groups=len(groups),
            tokens=sum(len(s.completion_ids) for s in sequences),
        )

    # -- the step
    def step(self, groups: list[ClaimedGroup] | PreparedStep) -> StepReport:
        """One optimizer step on this process's groups (under several processes, each claims its own),
        or on what ``prepare`` made of them."""
        started = time.perf_counter()
        report = self.accumulate(groups)
        grad_norm = self.apply()
        return replace(
            report,
            grad_norm=grad_norm,
            learning_rate=float(self.scheduler.get_last_lr()[0]),
            seconds=time.perf_counter() - started,
        )

    def accumulate(self, groups: list[ClaimedGroup] | PreparedStep) -> StepReport:
        """The step's gradients, accumulated over micro-batches (and averaged over processes), not yet
        applied; normalised by the completion tokens of every process's groups."""
        started = time.perf_counter()
        config = self.config
        prepared = groups if isinstance(groups, PreparedStep) else self.prepare(groups)
        batches = prepared.micro_batches
        step_tokens = float(prepared.tokens)
        if self.accelerator.num_processes > 1:  # one process knows its count without a round trip through the device
            step_tokens = float(self.accelerator.reduce(torch.tensor(prepared.tokens, device=self.accelerator.device), "sum"))
            step_tokens /= self.accelerator.num_processes  # each process divides its sum; the gradients' mean restores it
        self.model.train()
        ref_logps: list[torch.Tensor | None] = [None] * len(batches)
        if self.reference is not None:
            with torch.no_grad():
                ref_logps = [self._logps(self.reference, batch) for batch in batches]
        outs: list[PolicyLoss] = []
        for i, batch in enumerate(batches):
            # gradients are averaged across processes once, on the last micro-batch
            with self.accelerator.no_sync(self.model) if i < len(batches) - 1 else contextlib.nullcontext():
                with self.accelerator.autocast():
                    logps = self._logps(self.model, batch)
                    out = policy_loss(
                        logps,
                        logps.detach(),  # one update per claimed batch: the policy before it is this one
                        batch.tensors["advantages"],
                        batch.tensors["completion_mask"],
                        epsilon_low=config.epsilon_low,
                        epsilon_high=config.epsilon_high,
                        step_tokens=step_tokens,
                        behaviour_logps=batch.tensors.get("behaviour_logps"),
                        importance_cap=config.importance_cap,
                        ref_logps=ref_logps[i],
                        beta=config.beta,
                    )
                self.accelerator.backward(out.loss)
            outs.append(replace(out, loss=out.loss.detach()))
        rewards = prepared.rewards
        # each process's loss is over the step's tokens divided among the processes: their mean is the step's
        loss_total = float(self.accelerator.reduce(sum(o.loss for o in outs), reduction="mean")) if outs else 0.0
        return StepReport(
            loss=loss_total,
            clip_fraction=_mean([o.clip_fraction for o in outs]) or 0.0,
            importance_weight=_mean([o.importance_weight for o in outs if o.importance_weight is not None]),
            kl=_mean([o.kl for o in outs if o.kl is not None]),
            grad_norm=float("nan"),
            learning_rate=float(self.scheduler.get_last_lr()[0]),
            reward_mean=statistics.fmean(rewards) if rewards else 0.0,
            reward_std=statistics.pstdev(rewards) if rewards else 0.0,
            groups=prepared.groups,
            samples=len(rewards),
            tokens=prepared.tokens,
            seconds=time.perf_counter() - started,
        )

    def apply(self) -> float:
        """Clip the accumulated gradients, step the optimizer and the schedule; the norm before clipping."""
        grad_norm = self.accelerator.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        # read after the optimizer's kernels are queued: read before, it would hold the host until the backward
        # drained, and the device would then idle while the host launched the optimizer
        norm = float(grad_norm)
        return norm if math.isfinite(norm) else float("nan")

    def save(self, directory: Path) -> Path:
        """The adapter (LoRA) or the whole model, with the tokenizer, where serving can load it, and the
        optimizer's moments beside them (serving ignores the file), so the next round goes on with them."""
        directory.mkdir(parents=True, exist_ok=True)
        self.accelerator.unwrap_model(self.model).save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)
        if self._whole_optimizer_here() and self.accelerator.is_main_process:
            torch.save(self.optimizer.state_dict(), directory / OPTIMIZER_FILE)
        return directory

    def _whole_optimizer_here(self) -> bool:
        """Whether this process holds the whole optimizer state (one process or DDP: FSDP and DeepSpeed
        shard it, and their moments start afresh each round)."""
        from accelerate.utils import DistributedType

        return self.accelerator.distributed_type in (DistributedType.NO, DistributedType.MULTI_CPU, DistributedType.MULTI_GPU)


def _mean(values: list[torch.Tensor]) -> float | None:
    """The mean of a step's per-micro-batch figures, read back from the device once."""
    return float(torch.stack(values).mean()) if values else None
