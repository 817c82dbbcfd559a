"""A LoRA adapter for the tiny models of ``trainer.tiny_model``, with random weights, for tests of
serving adapters."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import LlamaForCausalLM


def build_lora(model_dir: Path, directory: Path, seed: int) -> Path:
    """A LoRA adapter with random (non-zero) weights, so it visibly changes the model's output."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    base = LlamaForCausalLM.from_pretrained(model_dir)
    config = LoraConfig(r=4, lora_alpha=64, target_modules=["q_proj", "v_proj", "o_proj"], init_lora_weights=False)
    get_peft_model(base, config).save_pretrained(directory)
    return directory
