"""Outputs cross from a child to the judge as files loaded with ``weights_only``."""

from __future__ import annotations

from pathlib import Path

import torch

from reward_svc.harness import tensors


def test_named_tuple_outputs_load_under_weights_only(tmp_path: Path) -> None:
    """``torch.max(x, dim)`` returns a ``torch.return_types`` class that weights_only refuses."""
    x = torch.randn(4, 5)
    output = [torch.max(x, dim=1), {"sum": x.sum(0)}]
    tensors.save(tmp_path / "out.pt", output)
    loaded = torch.load(tmp_path / "out.pt", weights_only=True)
    values, indices = loaded[0]
    assert type(loaded[0]) is tuple and torch.equal(values, x.max(dim=1).values) and torch.equal(indices, x.argmax(dim=1))
    assert torch.equal(loaded[1]["sum"], x.sum(0))
