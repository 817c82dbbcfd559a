"""The proposer API end to end: real uvicorn, real Celery worker, real Redis, SQLite, sandboxed
validation; and ``kernelzero proposer propose`` locally."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from proposer_svc.mining import directory_corpus, mine, save_stats
from servers import serve
from services.clients.proposer import ProposerClient
from services.config import Settings
from services.db.models import Candidate, Score
from services.db.session import session_scope

# A small corpus of catalog APIs, mined into the "small" statistics the worker samples from.
CORPUS = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.norm = nn.LayerNorm(16)

    def forward(self, x):
        return F.gelu(self.norm(self.fc(x)))


class Attn(nn.Module):
    def forward(self, q, k):
        return torch.softmax(q @ k.transpose(-1, -2), dim=-1).sum(dim=-1)


class Conv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)

    def forward(self, x):
        return torch.relu(self.conv(x)).mean(dim=1)
"""


def mine_small_corpus(root: Path) -> None:
    root.mkdir()
    (root / "models.py").write_text(CORPUS)
    sources = directory_corpus([root])
    save_stats("small", mine(sources), sources)


@pytest.fixture
def proposer_api(platform_env: Callable[..., Settings], start_worker, free_port, tmp_path: Path) -> Iterator[str]:  # type: ignore[no-untyped-def]
    platform_env(auth_enabled="false", proposer_corpus="small")
    mine_small_corpus(tmp_path / "corpus")
    start_worker("proposer")
    with serve("proposer_svc.api:app", free_port()) as url:
        yield url


def add_verdicts(task_id: str, outcomes: list[bool]) -> None:
    with session_scope() as session:
        candidate = Candidate(task_id=task_id, backend="triton", source="# kernel", source_hash="k" * 64)
        session.add(candidate)
        session.flush()
        session.add_all(
            Score(candidate_id=candidate.id, status="correct" if ok else "incorrect", correct=ok, reason="test")
            for ok in outcomes
        )


def test_propose_list_get_and_frontier(proposer_api: str) -> None:
    body = {"count": 3, "seed": 7, "device": "cpu", "wait_s": 300}
    response = httpx.post(f"{proposer_api}/v1/tasks/propose", json=body, timeout=330)
    assert response.status_code == 200, response.text
    data = response.json()
    assert data["job_status"] == "succeeded", data
    summary = data["result"]
    assert summary["requested"] == 3 and summary["corpus"] == "small"
    assert summary["valid"] + summary["rejected"] + summary["declined"] + summary["exists"] == 3
    assert summary["valid"] >= 2, summary["proposals"]
    assert summary["apis_covered"] >= 2
    stored = [p for p in summary["proposals"] if p["task_id"]]
    assert len(stored) == summary["valid"] + summary["rejected"]
    assert all(p["reason"] for p in summary["proposals"])

    again = httpx.post(f"{proposer_api}/v1/tasks/propose", json=body, timeout=30).json()
    assert again["job_id"] == data["job_id"]  # same seed, same request: the same job, not a second round

    listed = httpx.get(f"{proposer_api}/v1/tasks", timeout=10).json()
    assert listed["total"] == len(stored) and {t["id"] for t in listed["items"]} == {p["task_id"] for p in stored}
    valid = httpx.get(f"{proposer_api}/v1/tasks", params={"status": "valid", "origin": "composer", "limit": 1}, timeout=10).json()
    assert valid["total"] == summary["valid"] and len(valid["items"]) == 1 and valid["items"][0]["status"] == "valid"

    with ProposerClient(base_url=proposer_api) as client:
        task = client.task(valid["items"][0]["id"])
        assert task.source_hash == hashlib.sha256(task.source.encode()).hexdigest()
        assert "class Model" in task.source and "def get_inputs" in task.source
        assert task.api_set and task.input_shapes and task.origin == "composer"
        assert task.details and task.details["normalised_hash"]

        missing = httpx.get(f"{proposer_api}/v1/tasks/nope", timeout=10)
        assert missing.status_code == 404 and "nope" in missing.json()["detail"]

        add_verdicts(task.id, [True, False, True, False])  # p = 0.5: the top of the frontier
        frontier = client.frontier(count=5, bins=4)
    assert frontier.pool_tasks == summary["valid"] and frontier.scored_tasks == 1
    assert frontier.histogram == [0, 0, 1, 0]
    assert frontier.tasks[0].task_id == task.id and frontier.tasks[0].reward == 1.0 and frontier.tasks[0].pass_rate == 0.5
    assert all(t.explored and t.attempts == 0 for t in frontier.tasks[1:])


def test_submit_without_waiting_answers_202(proposer_api: str) -> None:
    response = httpx.post(f"{proposer_api}/v1/tasks/propose", json={"count": 1, "device": "cpu"}, timeout=30)
    assert response.status_code == 202, response.text
    with ProposerClient(base_url=proposer_api) as client:
        job = client.wait_for_job(response.json()["job_id"], timeout_s=300)
    assert job.status == "succeeded", job.error
    assert job.result is not None and job.result["requested"] == 1


def test_bad_input_gets_4xx(proposer_api: str) -> None:
    for bad in ({"count": 0}, {"count": 1000}, {"count": 1, "backend": "gpt"}, {"count": 1, "difficulty": 2}, {}):
        response = httpx.post(f"{proposer_api}/v1/tasks/propose", json=bad, timeout=10)
        assert response.status_code == 422, bad
    unavailable = httpx.post(f"{proposer_api}/v1/tasks/propose", json={"count": 1, "backend": "llm"}, timeout=10)
    assert unavailable.status_code == 400 and "KZ_CODER_MODEL_BACKEND" in unavailable.json()["detail"]
    response = httpx.get(f"{proposer_api}/v1/tasks", params={"status": "bogus"}, timeout=10)
    assert response.status_code == 422 and "status" in response.text
    assert httpx.get(f"{proposer_api}/v1/frontier", params={"count": -1}, timeout=10).status_code == 422


def test_cli_propose_json(platform_env: Callable[..., Settings], tmp_path: Path) -> None:
    platform_env(proposer_corpus="small")
    mine_small_corpus(tmp_path / "corpus")
    kernelzero = Path(sys.executable).with_name("kernelzero")
    command = [str(kernelzero), "proposer", "propose", "--count", "2", "--device", "cpu", "--seed", "3", "--json"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(run.stdout)
    assert summary["requested"] == 2 and summary["corpus"] == "small"
    assert summary["valid"] + summary["rejected"] + summary["declined"] + summary["exists"] == 2
    assert summary["valid"] >= 1, summary["proposals"]
    repeat = subprocess.run(command, capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert repeat.returncode == 0, repeat.stderr[-3000:]
    again = json.loads(repeat.stdout)  # the same seed composes the same sources: nothing new is stored
    assert again["exists"] == 2 - summary["declined"] and again["valid"] == again["rejected"] == 0
