"""Building a KernelBench module's model in a child: its init inputs and its weights from a seed, so
the reference and a candidate (``Model`` and ``ModelNew``) start from the same parameters."""

from __future__ import annotations

from typing import Any

import torch


def build_model(module: Any, cls_name: str, weight_seed: int, device: str, init_inputs: list[Any]) -> torch.nn.Module:
    # torch.random's, not the alias torch.manual_seed, which torch._dynamo rewraps when it loads (a candidate's
    # custom op loads it): the function the harness calls stays the one its integrity snapshot saw
    torch.random.manual_seed(weight_seed)
    model = getattr(module, cls_name)(*init_inputs)
    return model.to(device).eval() if isinstance(model, torch.nn.Module) else model


def make_init_inputs(module: Any, weight_seed: int) -> list[Any]:
    torch.random.manual_seed(weight_seed)
    return list(module.get_init_inputs()) if hasattr(module, "get_init_inputs") else []
