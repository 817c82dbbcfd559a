"""The Coder's policy loss (``trainer/loss.py``) against TRL's ``GRPOTrainer`` with ``loss_type="dapo"``
on the same tiny model and the same fixed batch: the loss and its gradients agree. Then the parts TRL's
test cannot reach: the clip fraction, truncated importance weights, the KL term."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM

from trainer.loss import completion_logps, fuse_logps_head, policy_loss
from trainer.tiny_model import build_tiny_lm

EPSILON_LOW, EPSILON_HIGH = 0.2, 0.28


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_lm(tmp_path_factory.mktemp("tiny-lm") / "tiny")


def fixed_batch(vocab: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Four completions of unequal length (padding masked), two prompts, advantages of both signs, and
    old log-probabilities a little off the model's, so some ratios leave the clip range."""
    generator = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(5, vocab, (4, 6), generator=generator)
    completion_ids = torch.randint(5, vocab, (4, 9), generator=generator)
    completion_mask = torch.ones(4, 9, dtype=torch.long)
    completion_mask[1, 6:] = 0
    completion_mask[3, 3:] = 0
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": torch.ones_like(prompt_ids),
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.tensor([1.2, -0.7, 0.4, -1.5]),
        "old_noise": torch.randn(4, 9, generator=generator) * 0.3,
    }


def ours(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    logps = completion_logps(model, batch["prompt_ids"], batch["prompt_mask"], batch["completion_ids"], batch["completion_mask"])
    mask = batch["completion_mask"]
    return policy_loss(
        logps,
        batch["old_per_token_logps"],
        batch["advantages"],
        mask,
        epsilon_low=EPSILON_LOW,
        epsilon_high=EPSILON_HIGH,
        step_tokens=float(mask.sum()),
    ).loss


def test_the_loss_and_its_gradients_are_trls_dapo_loss(tiny: Path, tmp_path: Path) -> None:
    from trl import GRPOConfig, GRPOTrainer

    model = fuse_logps_head(AutoModelForCausalLM.from_pretrained(tiny), 1.0)
    batch = fixed_batch(model.config.vocab_size)
    with torch.no_grad():
        current = completion_logps(
            model, batch["prompt_ids"], batch["prompt_mask"], batch["completion_ids"], batch["completion_mask"]
        )
    batch["old_per_token_logps"] = current + batch.pop("old_noise")

    args = GRPOConfig(
        output_dir=str(tmp_path / "trl"),
        loss_type="dapo",
        beta=0.0,
        epsilon=EPSILON_LOW,
        epsilon_high=EPSILON_HIGH,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=9,
        temperature=1.0,
        steps_per_generation=1,
        bf16=False,  # fp32 throughout: TRL's CPU default autocasts its LM head to bf16
        report_to="none",
        use_cpu=True,
        logging_steps=1,
    )
    trl = GRPOTrainer(
        model=model,
        reward_funcs=lambda completions, **_: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["x"] * 4}),
    )
    model.train()  # no dropout in the tiny model: train mode is TRL's mode and changes nothing else
    trl.current_gradient_accumulation_steps = 1  # what its training loop sets: one micro-batch per optimizer step
    inputs = {**batch, "num_items_in_batch": batch["completion_mask"].sum()}

    model.zero_grad()
    theirs = trl._compute_loss(model, inputs)
    theirs.backward()
    their_grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]

    model.zero_grad()
    mine = ours(model, batch)
    mine.backward()
    my_grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]

    assert torch.allclose(mine, theirs, atol=1e-6, rtol=1e-5), (float(mine), float(theirs))
    assert len(my_grads) == len(their_grads) > 0
    assert all(torch.allclose(a, b, atol=1e-6, rtol=1e-4) for a, b in zip(my_grads, their_grads))


def test_the_attention_mask_is_left_out_only_where_no_prompt_is_left_padded(tiny: Path) -> None:
    """Completions padded on the right only: the model gets no mask (plain causal attention) and the
    log-probabilities and their gradients are the masked ones. A left-padded prompt keeps the mask."""
    model = fuse_logps_head(AutoModelForCausalLM.from_pretrained(tiny), 1.0)
    masks_seen: list[torch.Tensor | None] = []
    model.model.register_forward_pre_hook(
        lambda _, args, kwargs: masks_seen.append(kwargs.get("attention_mask")), with_kwargs=True
    )
    batch = fixed_batch(model.config.vocab_size)
    tensors = [batch[k] for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")]

    def logps_and_grads(prompts_padded: bool | None) -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad()
        logps = completion_logps(model, *tensors, prompts_padded=prompts_padded)
        (logps * batch["advantages"][:, None]).sum().backward()
        return logps.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    unmasked, unmasked_grads = logps_and_grads(None)  # read from the all-ones prompt mask
    masked, masked_grads = logps_and_grads(True)
    assert masks_seen[0] is None and masks_seen[1] is not None
    torch.testing.assert_close(unmasked, masked, atol=1e-6, rtol=1e-5)
    assert len(unmasked_grads) == len(masked_grads) > 0
    for a, b in zip(unmasked_grads, masked_grads):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)

    batch["prompt_mask"][0, :2] = 0  # the first prompt two tokens shorter, padded on the left
    completion_logps(model, batch["prompt_ids"], batch["prompt_mask"], batch["completion_ids"], batch["completion_mask"])
    assert masks_seen[2] is not None


def test_the_clip_holds_only_the_side_the_advantage_pushes() -> None:
    """A ratio above 1+ε_high with a positive advantage, or below 1-ε_low with a negative one, is held
    (no gradient); the other sides still learn."""
    logps = torch.log(torch.tensor([[1.5, 0.5, 1.5, 0.5]])).requires_grad_()
    old = torch.zeros(1, 4)
    mask = torch.ones(1, 4)
    advantages = torch.tensor([[1.0, -1.0, -1.0, 1.0]])
    out = policy_loss(logps, old, advantages, mask, epsilon_low=0.2, epsilon_high=0.28, step_tokens=4)
    out.loss.backward()
    assert float(out.clip_fraction) == 0.5
    assert logps.grad is not None
    assert logps.grad[0, 0] == 0 and logps.grad[0, 1] == 0  # held
    assert logps.grad[0, 2] != 0 and logps.grad[0, 3] != 0  # free to move back toward the old policy


def test_importance_weights_are_truncated_and_the_kl_term_needs_its_reference() -> None:
    logps = torch.zeros(1, 3)
    old = torch.zeros(1, 3)
    behaviour = torch.log(torch.tensor([[1.0, 0.1, 0.5]]))  # the sampler thought two tokens far less likely
    mask = torch.ones(1, 3)
    weighted = policy_loss(
        logps,
        old,
        torch.tensor([1.0]),
        mask,
        epsilon_low=0.2,
        epsilon_high=0.2,
        step_tokens=3,
        behaviour_logps=behaviour,
        importance_cap=3.0,
    )
    assert float(weighted.importance_weight) == pytest.approx((1 + 3 + 2) / 3)  # exp(0 - log 0.1) = 10, truncated at 3
    assert float(weighted.loss) == pytest.approx(-(1 + 3 + 2) / 3)
    with pytest.raises(ValueError, match="reference"):
        policy_loss(logps, old, torch.tensor([1.0]), mask, epsilon_low=0.2, epsilon_high=0.2, step_tokens=3, beta=0.1)
    kl = policy_loss(
        logps,
        old,
        torch.tensor([0.0]),
        mask,
        epsilon_low=0.2,
        epsilon_high=0.2,
        step_tokens=3,
        beta=0.5,
        ref_logps=torch.log(torch.tensor([[0.5, 1.0, 1.0]])),
    )
    expected = (0.5 - torch.log(torch.tensor(0.5)) - 1) / 3  # k3 on the first token, 0 on the others
    assert float(kl.kl) == pytest.approx(float(expected))
    assert float(kl.loss) == pytest.approx(0.5 * float(expected))
