"""The Coder's policy loss: CA-GRPO's group-relative advantages under DAPO's clipped, token-level
surrogate, with truncated importance sampling against the sampler's own log-probabilities.

Written here rather than taken from TRL because TRL's ``GRPOTrainer`` owns the sampling loop, and our
rollouts arrive already sampled and scored (from the Coder's and the reward service's queues). The
arithmetic is TRL's ``loss_type="dapo"``; ``tests/test_trainer_loss.py`` holds the two equal on the
same batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class PolicyLoss:
    """The loss of one micro-batch, already divided by the step's token count, and what it did. The
    figures stay on the device (0-dim tensors): a step reads them back once, not once per micro-batch,
    which would hold the host until the device drained each time."""

    loss: torch.Tensor
    clip_fraction: torch.Tensor  # share of the tokens whose ratio the clip held
    kl: torch.Tensor | None  # mean per-token KL to the reference model, where one is used
    importance_weight: torch.Tensor | None  # mean truncated importance weight, where behaviour log-probs were given


def fuse_logps_head(model: Any, temperature: float) -> Any:
    """Give ``model`` TRL's fused LM head (``add_fused_lm_head``, before PEFT wraps it), which
    ``completion_logps`` asks for: per-token log-probabilities at ``temperature`` (the distribution
    the completions were drawn from), projecting through the head in tiles only the positions that
    hold a completion token, never the (batch, tokens, vocabulary) logits, as TRL's own step does.
    Generation is unchanged."""
    from trl.trainer import add_fused_lm_head

    add_fused_lm_head(model, temperature=temperature)
    return model


def completion_logps(
    model: Any,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    prompts_padded: bool | None = None,
) -> torch.Tensor:
    """Per-token log-probabilities (B, T) of the completions under ``model`` (its head fused by
    ``fuse_logps_head``); 0 at padding. Prompts are padded on the left, completions on the right
    (``completion_mask``: ones, then zeros).

    Where no prompt is left-padded the model gets no attention mask: all the padding is then the
    completions', on the right, where causal attention keeps every real token from seeing it, so the
    real tokens' log-probabilities are the ones the mask gives, and attention runs as plain causal
    attention (on a GPU SDPA's flash kernel over the lower triangle, instead of the memory-efficient
    kernel over every (query, key) pair with a (B, 1, L, L) mask built for it), and transformers skips
    its check of the mask (host syncs per forward). TRL's step passes the mask. ``prompts_padded``:
    whether some prompt is left-padded, where the caller knows it from the lengths; otherwise it is read
    from ``prompt_mask`` (one sync)."""
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
    width = completion_ids.size(1)
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    labels[:, :-width] = -100  # only the completions are scored
    if prompts_padded is None:
        prompts_padded = not bool(prompt_mask.all())
    out = model(input_ids=input_ids, attention_mask=attention_mask if prompts_padded else None, labels=labels, fused_lm_head=True)
    return out.log_probs[:, -width:]  # position t's value is token t + 1's log-probability


def policy_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    epsilon_low: float,
    epsilon_high: float,
    step_tokens: float,
    behaviour_logps: torch.Tensor | None = None,
    importance_cap: float | None = None,
    ref_logps: torch.Tensor | None = None,
    beta: float = 0.0,
) -> PolicyLoss:
    """``-min(r·A, clip(r, 1-ε_low, 1+ε_high)·A)`` per completion token, ``r`` the ratio to the policy
    the rollouts were scored under (``old_logps``), summed and divided by ``step_tokens`` (the
    completion tokens of the whole optimizer step: DAPO's token-level normalisation, so a long
    completion weighs by its tokens and accumulation changes nothing). With ``behaviour_logps`` (what
    the sampler, vLLM say, reported) each token is weighted by ``exp(old - behaviour)``, truncated at
    ``importance_cap``; with ``beta`` a k3 KL to ``ref_logps`` is added per token."""
    advantages = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    ratio = torch.exp(logps - old_logps)
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    per_token = -torch.min(ratio * advantages, clipped * advantages)
    importance_weight = None
    if behaviour_logps is not None:
        weight = torch.exp(old_logps - behaviour_logps)
        weight = torch.clamp(weight, max=importance_cap) if importance_cap is not None else weight
        per_token = per_token * weight
        importance_weight = ((weight * mask).sum() / mask.sum().clamp(min=1)).detach()
    kl = None
    if beta:
        if ref_logps is None:
            raise ValueError("a KL term (beta > 0) needs the reference model's log-probabilities")
        per_token_kl = torch.exp(ref_logps - logps) - (ref_logps - logps) - 1
        per_token = per_token + beta * per_token_kl
        kl = ((per_token_kl * mask).sum() / mask.sum().clamp(min=1)).detach()
    loss = (per_token * mask).sum() / max(step_tokens, 1.0)
    held = ((ratio < 1 - epsilon_low) & (advantages < 0)) | ((ratio > 1 + epsilon_high) & (advantages > 0))
    clip_fraction = ((held.float() * mask).sum() / mask.sum().clamp(min=1)).detach()
    return PolicyLoss(loss, clip_fraction, kl, importance_weight)
