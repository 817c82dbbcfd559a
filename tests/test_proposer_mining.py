"""API co-occurrence mining: exact counts on a hand-written corpus, persistence, the default corpus."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from itertools import combinations
from pathlib import Path

import pytest

from proposer_svc.mining import CorpusSource, default_corpus, directory_corpus, load_stats, mine, save_stats
from services.config import Settings
from services.db import migrate

CONV_MODULE = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class A(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.act = F.gelu
        self.scale = nn.Parameter(torch.ones(8))

    def forward(self, x, n: int):
        y = self.conv(x)
        y = self.act(y) * self.scale
        k = n + 1
        return y.softmax(dim=-1)[:, :k]
"""

SEQUENTIAL_MODULE = """
from torch import nn
from torch.nn import functional
import torch as T


class B(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 4), nn.ReLU())

    def forward(self, x):
        h = self.body(x)
        h = nn.functional.relu(h) + functional.relu(x)
        return self._finish(h)

    def _finish(self, h):
        parts = "a,b".split(",")
        return T.cat([h, h @ h], dim=0)


class NoForward(nn.Module):
    def helper(self, x):
        return T.relu(x)


class Abstract(nn.Module):
    def forward(self, x):
        raise NotImplementedError
"""

# Relative imports resolve only inside a known package (here as if it were torch.nn.modules).
RELATIVE_MODULE = """
from .linear import Linear
from .module import Module
from .. import functional as F


class C(Module):
    def __init__(self):
        super().__init__()
        self.lin = Linear(2, 2)

    def forward(self, input):
        return F.silu(self.lin(input))
"""

EXPECTED_SETS = [
    {"torch.nn.Conv2d", "torch.nn.functional.gelu", "torch.mul", "Tensor.softmax"},
    {"torch.nn.Linear", "torch.nn.ReLU", "torch.nn.functional.relu", "torch.add", "torch.cat", "torch.matmul"},
    {"torch.nn.Linear", "torch.nn.functional.silu"},
]


def write_corpus(root: Path) -> list[CorpusSource]:
    (root / "plain").mkdir(parents=True)
    (root / "pkg").mkdir()
    (root / "plain" / "conv.py").write_text(CONV_MODULE)
    (root / "plain" / "seq.py").write_text(SEQUENTIAL_MODULE)
    (root / "plain" / "broken.py").write_text("def broken(:\n    pass\n")
    (root / "pkg" / "rel.py").write_text(RELATIVE_MODULE)
    return [*directory_corpus([root / "plain"]), CorpusSource(root / "pkg", package="torch.nn.modules")]


def test_small_corpus_gives_exact_counts(tmp_path: Path) -> None:
    result = mine(write_corpus(tmp_path))
    assert result.files == 4
    assert len(result.skipped) == 1 and "broken.py" in result.skipped[0]
    stats = result.stats
    assert stats.modules == 3  # NoForward has no forward, Abstract's forward uses no API
    expected_usage: dict[str, int] = {}
    expected_pairs: dict[tuple[str, str], int] = {}
    for apis in EXPECTED_SETS:
        for api in apis:
            expected_usage[api] = expected_usage.get(api, 0) + 1
        for pair in combinations(sorted(apis), 2):
            expected_pairs[pair] = expected_pairs.get(pair, 0) + 1
    assert stats.usage == expected_usage
    assert stats.pairs == expected_pairs
    assert stats.usage["torch.nn.Linear"] == 2
    assert stats.pairs[("torch.nn.Linear", "torch.nn.functional.silu")] == 1
    assert "torch.relu" not in stats.usage  # only in a class without forward
    assert "Tensor.split" not in stats.usage  # str.split on a literal is not torch


def test_tensor_operators_need_a_tensor_operand(tmp_path: Path) -> None:
    (tmp_path / "ops.py").write_text("""
import torch
class M(torch.nn.Module):
    def forward(self, x, size: int, mask=None):
        n = x.size(0) * 2            # shape arithmetic: no torch.mul
        w = size - 1                 # int argument: no torch.sub
        y = torch.exp(x)
        y /= 3                       # y came from an API: torch.div
        return y[:n]
""")
    stats = mine(directory_corpus([tmp_path])).stats
    assert stats.usage == {"Tensor.size": 1, "torch.exp": 1, "torch.div": 1}


def test_stats_persist_and_re_mining_replaces(kz_env: Callable[..., Settings], tmp_path: Path) -> None:
    kz_env()
    migrate.upgrade()
    sources = write_corpus(tmp_path / "corpus")
    first = mine(sources)
    save_stats("small", first, sources)
    assert load_stats("small") == first.stats
    assert load_stats("nothing-here") is None

    only_conv = [CorpusSource(tmp_path / "corpus" / "plain", "conv.py")]
    second = mine(only_conv)
    save_stats("small", second, only_conv)
    loaded = load_stats("small")
    assert loaded == second.stats and loaded is not None
    assert loaded.modules == 1 and "torch.nn.Linear" not in loaded.usage


@pytest.mark.slow
def test_default_corpus_mines_real_modules() -> None:
    result = mine(default_corpus())
    stats = result.stats
    assert result.files > 300
    assert stats.modules > 2000
    assert len(stats.usage) > 150
    for api in ("torch.nn.Linear", "torch.nn.functional.softmax", "torch.matmul", "Tensor.view", "torch.nn.LayerNorm"):
        assert stats.usage.get(api, 0) > 50, api
    assert stats.pairs[("torch.nn.Dropout", "torch.nn.Linear")] > 100
    assert all(a < b for a, b in stats.pairs)


def test_cli_mine_and_stats(kz_env: Callable[..., Settings], tmp_path: Path) -> None:
    kz_env()
    migrate.upgrade()
    write_corpus(tmp_path / "corpus")
    kernelzero = Path(sys.executable).with_name("kernelzero")
    env = dict(os.environ, COLUMNS="200")
    mined = subprocess.run(
        [str(kernelzero), "proposer", "mine", "--corpus", str(tmp_path / "corpus" / "plain"), "--name", "small"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert mined.returncode == 0, mined.stderr
    assert "3 files, 2 forward bodies" in mined.stdout and "1 files skipped" in mined.stdout
    shown = subprocess.run(
        [str(kernelzero), "proposer", "stats", "--name", "small", "--top", "3"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert shown.returncode == 0, shown.stderr
    assert "10 APIs" in shown.stdout and "torch.nn.Conv2d" in shown.stdout
    missing = subprocess.run(
        [str(kernelzero), "proposer", "stats", "--name", "nothing"], capture_output=True, text=True, timeout=120, env=env
    )
    assert missing.returncode == 1 and "kernelzero proposer mine" in missing.stderr
