"""Outputs cross from a child to the judge as files loaded with ``weights_only``."""

from __future__ import annotations

from pathlib import Path

import pytest
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


def test_the_judge_reads_case_0_expected_once_for_its_three_comparisons(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Trial 0, the refresh and the knockout all compare against case 0: a GB-sized file is read once."""
    from reward_svc import verify

    output = torch.randn(256)
    tensors.save(tmp_path / "output.pt", output)
    tensors.save(tmp_path / "expected_0.pt", output.clone())
    tensors.save(tmp_path / "expected_1.pt", output + 1)
    loaded: list[str] = []
    load = tensors.load
    monkeypatch.setattr(verify.tensors, "load", lambda path, *a, **k: loaded.append(path.name) or load(path, *a, **k))
    compare_files = verify.FileComparer(verify.Tolerance())
    verdicts = [compare_files(tmp_path / "output.pt", tmp_path / f"{name}.pt")[0]
                for name in ("expected_0", "expected_1", "expected_0", "expected_0")]
    assert verdicts == [True, False, True, True]
    assert loaded.count("expected_0.pt") == 1 and loaded.count("expected_1.pt") == 1
