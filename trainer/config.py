"""Run configurations: typed, with help text and checks, in the manner of TRL's ``*Config`` classes.

A configuration that cannot work (a group size the reward is not computed over, a model path that is
not there, a LoRA target that matches no module, a negative staleness) is refused when the run is
submitted, with the reason (``ConfigError``), never hours into it. These are run settings, not
deployment settings: they live here, not in ``services.config.Settings``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, model_validator

from services.config import ConfigurationError
from services.schemas.numbers import StrictFiniteFloat
from services.schemas.reward import CAGRPOConfig


class ConfigError(ConfigurationError):
    """A run configuration that cannot work; the message says why, in one line."""


# Upper bounds on every count a run is given: far above any run this platform makes (a step count of the
# papers' runs is in the hundreds, a batch in the tens), low enough that a typo or a hostile submission
# (anyone with a key may submit a run) cannot queue a run of millions of steps or ask for a batch no
# device holds. Over one, the config is refused with the field and the bound.
MAX_STEPS = 100_000  # optimizer steps of a cold start, warm-up steps
MAX_STEPS_PER_ROUND = 10_000  # the Coder's or the Proposer's steps in one round of the loop
MAX_BATCH = 1024  # sequences per pass, groups per step, accumulation steps
MAX_TOKENS = 131_072  # a prompt or a completion, a trace's length
MAX_STALENESS = 100  # model versions a group may lag behind
MAX_TASKS_PER_ROUND = 10_000  # tasks the frontier picks in one round (coder_steps x groups_per_step by default)


class LoRAConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    r: StrictInt = Field(16, ge=1, le=1024, description="Rank of the adapter's matrices.")
    alpha: StrictInt = Field(32, ge=1, le=8192, description="Scale of the adapter's update (alpha / r multiplies it).")
    dropout: StrictFiniteFloat = Field(0.0, ge=0, lt=1, description="Dropout on the adapter's input.")
    target_modules: list[str] | Literal["all-linear"] = Field(
        "all-linear", description="Module names the adapter wraps (suffixes, as peft matches them), or every linear layer."
    )

    def to_peft(self) -> Any:
        """The same adapter as peft's ``LoraConfig`` (for a causal LM)."""
        from peft import LoraConfig

        return LoraConfig(
            r=self.r, lora_alpha=self.alpha, lora_dropout=self.dropout, target_modules=self.target_modules, task_type="CAUSAL_LM"
        )


def bf16_enabled(setting: bool | None) -> bool:
    """A run's ``bf16``: as set, or on where a GPU is."""
    import torch

    return setting if setting is not None else torch.cuda.is_available()


class PolicyRLConfig(BaseModel):
    """Group-relative policy optimisation of a causal LM on scored rollout groups, shared by the Coder's
    and the Proposer's runs: DAPO's clipped token-level surrogate, truncated importance sampling against
    the sampler, optional KL to the initial model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model_path: Path = Field(..., description="Local Hugging Face model directory of the served base model.")
    lora: LoRAConfig | None = Field(LoRAConfig(), description="Train a LoRA adapter (None: every weight).")
    learning_rate: StrictFiniteFloat = Field(1e-5, gt=0, le=1, description="Peak learning rate.")
    lr_scheduler: Literal["constant", "linear", "cosine"] = Field("constant", description="Decay after warm-up.")
    warmup_steps: StrictInt = Field(0, ge=0, le=MAX_STEPS, description="Optimizer steps of linear warm-up.")
    weight_decay: StrictFiniteFloat = Field(0.0, ge=0, description="AdamW's weight decay.")
    max_grad_norm: StrictFiniteFloat = Field(1.0, gt=0, description="Gradients are clipped to this global norm.")
    group_size: StrictInt = Field(8, ge=2, le=64, description="G: samples per prompt; advantages are relative within a group.")
    groups_per_step: StrictInt = Field(4, ge=1, le=MAX_BATCH, description="Groups (prompts) per optimizer step.")
    micro_batch_size: StrictInt = Field(
        4, ge=1, le=MAX_BATCH, description="Sequences per forward/backward pass (gradients accumulate over a step)."
    )
    epsilon_low: StrictFiniteFloat = Field(0.2, gt=0, lt=1, description="Lower clip of the policy ratio (1 - ε_low).")
    epsilon_high: StrictFiniteFloat = Field(0.28, gt=0, description="Upper clip (1 + ε_high); DAPO's clip-higher: 0.28.")
    importance_cap: StrictFiniteFloat | None = Field(
        3.0, gt=1, description="Truncation of the importance weight against the sampler's log-probs."
    )
    beta: StrictFiniteFloat = Field(0.0, ge=0, description="Weight of the KL to the reference (initial) model; 0 turns it off.")
    temperature: StrictFiniteFloat = Field(
        1.0, gt=0, description="The sampling temperature: logits are divided by it, as the sampler's were."
    )
    max_staleness: StrictInt = Field(
        2, le=MAX_STALENESS, description="K: groups generated more than K model versions ago are dropped."
    )
    max_prompt_tokens: StrictInt = Field(
        4096, ge=1, le=MAX_TOKENS, description="Longest prompt trained on, in tokens; longer ones are cut from the left."
    )
    max_completion_tokens: StrictInt = Field(
        4096, ge=1, le=MAX_TOKENS, description="Longest reply sampled and trained on, in tokens."
    )
    bf16: bool | None = Field(None, description="bf16 autocast; None: on where a GPU is.")
    seed: StrictInt = Field(0, ge=0, lt=2**32, description="numpy, which transformers seeds too, takes 32-bit seeds.")

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.max_staleness < 0:
            raise ValueError(f"max_staleness (K) must be 0 or more, not {self.max_staleness}")
        if self.epsilon_high < self.epsilon_low * 0.5:
            raise ValueError("epsilon_high below half of epsilon_low clips the side advantages push almost shut")
        return self

    def check(self, group_size_served: int | None = None) -> None:
        """What needs the file system or the model: refused now with the reason, not hours later."""
        check_model(self.model_path, self.lora)
        if group_size_served is not None and group_size_served != self.group_size:
            raise ConfigError(f"group_size {self.group_size} does not match the groups being scored ({group_size_served})")


class CoderRLConfig(PolicyRLConfig):
    """CA-GRPO for the Coder: group-relative advantages from the reward service's CA-GRPO rewards."""

    reward: CAGRPOConfig = Field(CAGRPOConfig(), description="How the reward service turns verdicts into rewards.")


class ProposerRLConfig(PolicyRLConfig):
    """GRPO for the Proposer's ``llm`` composer, the Coder frozen: a valid new module earns the frontier
    reward of the Coder's pass rate p on it (``linear``: 1 - |2p - 1|, highest where the Coder solves
    it half the time); a module that is declined, rejected by validation or already in the pool earns
    ``invalid_penalty`` (ρ)."""

    invalid_penalty: StrictFiniteFloat = Field(-0.5, le=0, description="ρ: the reward of a module that is not a valid new task.")
    coder_samples: StrictInt = Field(
        8, ge=1, le=64, description="k: the Coder's candidates per valid module, whose correct fraction is p."
    )
    frontier_shape: Literal["linear", "gaussian"] = Field("linear", description="The frontier reward's shape over p.")
    frontier_width: StrictFiniteFloat = Field(0.2, gt=0, description="Standard deviation of the gaussian shape.")
    difficulty: StrictFiniteFloat = Field(0.5, ge=0, le=1, description="The difficulty hint of the Proposer's prompt.")
    max_ops: StrictInt = Field(6, ge=1, le=32, description="The operation bound of the Proposer's prompt.")
    max_completion_tokens: StrictInt = Field(
        2048, ge=1, le=MAX_TOKENS, description="Longest module the composer writes and is trained on, in tokens."
    )


class ColdStartConfig(BaseModel):
    """Cold-start SFT of the Coder on verified traces, through TRL's ``SFTTrainer`` (loss on the
    completion only, the prompt rendered exactly as serving renders it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model_path: Path = Field(..., description="Local Hugging Face model directory of the Coder's base model.")
    lora: LoRAConfig | None = Field(LoRAConfig(), description="Train a LoRA adapter (None: every weight).")
    learning_rate: StrictFiniteFloat = Field(2e-5, gt=0, le=1, description="Peak learning rate.")
    epochs: StrictFiniteFloat = Field(2.0, gt=0, le=1000, description="Passes over the traces.")
    max_steps: StrictInt = Field(
        -1, ge=-1, le=MAX_STEPS, description="Stop after this many optimizer steps (-1: the epochs decide)."
    )
    batch_size: StrictInt = Field(4, ge=1, le=MAX_BATCH, description="Traces per device per forward/backward pass.")
    gradient_accumulation_steps: StrictInt = Field(1, ge=1, le=MAX_BATCH)
    max_length: StrictInt = Field(
        8192, ge=16, le=MAX_TOKENS, description="Prompt and completion tokens kept per trace (longer ones are cut)."
    )
    bf16: bool | None = Field(None, description="bf16; None: on where a GPU is.")
    seed: StrictInt = Field(0, ge=0, lt=2**32, description="numpy, which transformers seeds too, takes 32-bit seeds.")

    @model_validator(mode="after")
    def _steps(self) -> ColdStartConfig:
        if self.max_steps == 0:
            raise ValueError("max_steps must be -1 (the epochs decide) or at least 1, not 0")
        return self

    def check(self) -> None:
        check_model(self.model_path, self.lora)


class LoopConfig(BaseModel):
    """The alternating loop: per round, the Coder samples G candidates on each task the frontier picks
    (through the Coder service's queue, scored by the reward service's), trains ``coder_steps``
    CA-GRPO steps on the groups and publishes the result as the version the Coder serves next; then,
    with ``proposer_steps``, the Coder frozen, the Proposer's ``llm`` composer samples G modules per
    API set, the Coder's pass rate on each valid one sets its reward, and the Proposer trains
    ``proposer_steps`` GRPO steps and publishes the version the Proposer serves next."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        json_schema_extra={
            "examples": [
                {
                    "coder": {"model_path": "/models/qwen2.5-coder-7b", "group_size": 8, "groups_per_step": 4},
                    "rounds": 4,
                    "coder_steps": 20,
                }
            ]
        },
    )

    coder: CoderRLConfig = Field(..., description="The Coder's CA-GRPO settings (its model_path is the served base model).")
    proposer: ProposerRLConfig | None = Field(
        None, description="The Proposer's GRPO settings (its model_path is the Proposer's base model); needed for proposer_steps."
    )
    rounds: StrictInt = Field(1, ge=1, le=10_000, description="Rounds of the loop.")
    coder_steps: StrictInt = Field(20, ge=1, le=MAX_STEPS_PER_ROUND, description="N: the Coder's optimizer steps per round.")
    proposer_steps: StrictInt = Field(
        0, ge=0, le=MAX_STEPS_PER_ROUND, description="M: the Proposer's optimizer steps per round (0: it is not trained)."
    )
    tasks_per_round: StrictInt | None = Field(
        None,
        ge=1,
        le=MAX_TASKS_PER_ROUND,
        description="Tasks the frontier picks per round; default: coder_steps x groups_per_step (one group each).",
    )
    propose_per_round: StrictInt = Field(
        0, ge=0, le=500, description="New modules the Proposer composes and validates per round."
    )
    composer: Literal["composer", "llm"] | None = Field(None, description="Who composes them; default: the service's.")
    backend: Literal["triton", "cuda"] = Field("triton", description="Kernel language the Coder writes.")
    model_backend: Literal["hf", "openai"] | None = Field(
        None, description="Which of the Coder service's model backends samples; default: the one it serves."
    )
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="Where the reward service checks the candidates.")
    scoring_timeout_s: StrictFiniteFloat = Field(180.0, gt=0, le=3600, description="Wall-clock limit of each sandboxed child.")
    max_tokens: StrictInt = Field(4096, ge=1, le=65536, description="Longest reply sampled.")
    top_p: StrictFiniteFloat = Field(1.0, gt=0, le=1, description="Nucleus sampling; 1 samples the policy the loss assumes.")
    generation_timeout_s: StrictFiniteFloat = Field(3600.0, gt=0, description="How long one task's generation job may take.")
    seed: StrictInt = Field(0, ge=0, lt=2**32, description="Sampling seeds derive from it, the round and the task.")

    @model_validator(mode="after")
    def _buildable(self) -> LoopConfig:
        if self.proposer_steps and self.proposer is None:
            raise ValueError("proposer_steps needs the Proposer's settings (proposer: {model_path: ...})")
        if self.proposer is not None and not self.proposer_steps:
            raise ValueError("proposer is set but proposer_steps is 0: give the Proposer's steps per round, or drop proposer")
        if self.proposer_steps and self.composer == "composer":
            raise ValueError("Proposer RL trains the llm composer: composer must be llm (or left to the service's)")
        if self.tasks > MAX_TASKS_PER_ROUND:
            raise ValueError(
                f"{self.tasks} tasks per round (coder_steps {self.coder_steps} x coder.groups_per_step "
                f"{self.coder.groups_per_step}) is over the bound of {MAX_TASKS_PER_ROUND}: set tasks_per_round, or fewer steps"
            )
        return self

    @property
    def tasks(self) -> int:
        return self.tasks_per_round or self.coder_steps * self.coder.groups_per_step

    def check(self) -> None:
        self.coder.check()
        if self.proposer is not None:
            self.proposer.check()


RunConfig = TypeVar("RunConfig", CoderRLConfig, ColdStartConfig, LoopConfig)


def check_model(path: Path, lora: LoRAConfig | None) -> None:
    """The model directory exists and holds a config, and a LoRA target names modules it has."""
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ConfigError(f"model_path {path} is not a Hugging Face model directory (no config.json)")
    if lora is None or lora.target_modules == "all-linear":
        return
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    with init_empty_weights():  # the module names only: no memory for the weights
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [target for target in lora.target_modules if target not in names]
    if missing:
        raise ConfigError(f"LoRA target_modules {missing} match no module of {path.name} (it has e.g. {sorted(names)[:8]})")


def load_config(kind: type[RunConfig], path: Path | None, overrides: dict[str, object]) -> RunConfig:
    """A run configuration of ``kind`` from a YAML or JSON file (or none) and command-line overrides;
    ``ConfigError`` with every problem on one line."""
    data: dict[str, object] = {}
    if path is not None:
        text = path.read_text()
        if path.suffix in (".yaml", ".yml"):
            import yaml

            loaded = yaml.safe_load(text) or {}
        else:
            loaded = json.loads(text)
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path} holds a {type(loaded).__name__}, not a mapping of settings")
        data.update(loaded)
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return kind.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'config'}: {e['msg']}" for e in exc.errors())
        raise ConfigError(problems) from None
