"""The ``kernelzero`` command as a new user meets it: ``--version``, ``status``'s exit code, ``--json`` on
``apikey list`` and ``proposer stats``, a configuration that cannot work said in one line with exit 1, and
``down`` with nothing to stop (``test_foundation_launcher`` stops a running ``up`` with it)."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from services.config import Settings

ROOT = Path(__file__).resolve().parents[1]


def kernelzero(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kernelzero", *args], capture_output=True, text=True, timeout=300)


def test_version_and_status_exit_code(kz_env: Callable[..., Settings], free_port: Callable[[], int]) -> None:
    version = kernelzero("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"kernelzero {importlib.metadata.version('kernelzero')}"
    kz_env(**{f"{s}_port": free_port() for s in ("proposer", "coder", "reward", "trainer")})
    status = kernelzero("status", "--json")
    assert status.returncode == 1, status.stderr  # every service down: not a success
    report = json.loads(status.stdout)
    assert report["ready"] is False and set(report["services"].values()) == {"down"}
    assert kernelzero("status").returncode == 1


def test_json_on_apikey_list_and_proposer_stats(kz_env: Callable[..., Settings], tmp_path: Path) -> None:
    kz_env()
    created = kernelzero("apikey", "create", "ci-bot", "--admin")
    assert created.returncode == 0, created.stderr
    listed = kernelzero("apikey", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    [key] = json.loads(listed.stdout)
    assert key["name"] == "ci-bot" and key["admin"] is True and key["revoked_at"] is None
    assert created.stdout.strip().splitlines()[-1].startswith(key["prefix"])  # the key itself, printed once

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "block.py").write_text(
        "import torch\nclass Block(torch.nn.Module):\n    def forward(self, x):\n        return torch.relu(torch.exp(x))\n"
    )
    mined = kernelzero("proposer", "mine", "--corpus", str(corpus), "--name", "tiny")
    assert mined.returncode == 0, mined.stderr
    stats = kernelzero("proposer", "stats", "--name", "tiny", "--json")
    assert stats.returncode == 0, stats.stderr
    data = json.loads(stats.stdout)
    assert data["corpus"] == "tiny" and data["modules"] == 1
    assert {row["api"] for row in data["top_apis"]} == {"torch.relu", "torch.exp"}
    assert data["top_pairs"] == [{"apis": ["torch.exp", "torch.relu"], "modules": 1}]


def test_a_configuration_that_cannot_work_is_one_line_and_exit_1(kz_env: Callable[..., Settings]) -> None:
    kz_env()
    module = str(ROOT / "tests" / "kernels" / "relu" / "reference.py")
    run = kernelzero("generate", module, "--model-backend", "hf")
    assert run.returncode == 1
    assert run.stderr.strip() == "error: the hf backend needs KZ_CODER_HF_MODEL_PATH (a local Hugging Face model directory)"
    kz_env(coder_openai_base_url="http://127.0.0.1:9/v1", coder_max_retries=0)
    run = kernelzero("generate", module, "--model-backend", "openai")
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and "ConnectError" in run.stderr


def test_down_with_nothing_running_says_so(kz_env: Callable[..., Settings]) -> None:
    settings = kz_env()
    run = kernelzero("down")
    assert run.returncode == 0 and f"not running on {settings.data_dir}" in " ".join(run.stdout.split())
