"""The reward API end to end: real uvicorn, real Celery worker, real Redis, SQLite; and the CLI."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from reward_cases import CORRECT, HACKS, RELU_REFERENCE, candidate
from servers import serve
from services.config import Settings
from services.db.models import Score
from services.db.session import session_scope

WRONG = candidate("out = torch.empty_like(x)\nlaunch_relu(x, out)\nreturn out + 1.0")


@pytest.fixture
def reward_api(platform_env: Callable[..., Settings], start_worker, free_port) -> Iterator[str]:  # type: ignore[no-untyped-def]
    settings = platform_env(auth_enabled="false", reward_warm_children=1)
    start_worker("reward")
    with serve("reward_svc.api:app", free_port()) as url:
        yield url
    assert settings.auth_enabled is False


def test_group_endpoint_rewards_and_persists(reward_api: str) -> None:
    body = {
        "reference": RELU_REFERENCE,
        "candidates": [CORRECT, WRONG, HACKS["kernel_never_launched"][0]],
        "options": {"device": "cpu"},
        "wait_s": 120,
    }
    response = httpx.post(f"{reward_api}/v1/score/group", json=body, timeout=150)
    assert response.status_code == 200, response.text
    data = response.json()
    assert data["job_status"] == "succeeded"
    verdicts = data["result"]["verdicts"]
    assert [v["status"] for v in verdicts] == ["correct", "incorrect", "rejected"]
    assert verdicts[2]["guard"] == "no_custom_kernel"
    # ρ = 1/3 < 0.5: correctness only; advantages by hand.
    std = math.sqrt(((2 / 3) ** 2 + 2 * (1 / 3) ** 2) / 3)
    assert [v["reward"] for v in verdicts] == [1.0, 0.0, 0.0]
    assert [v["advantage"] for v in verdicts] == pytest.approx([(2 / 3) / std, -(1 / 3) / std, -(1 / 3) / std], rel=1e-5)
    with session_scope() as session:
        scores = list(session.scalars(select(Score).where(Score.job_id == data["job_id"])))
    assert sorted(s.status for s in scores) == ["correct", "incorrect", "rejected"]
    assert all(s.reason for s in scores)

    again = httpx.post(f"{reward_api}/v1/score/group", json=body, timeout=30).json()
    assert again["job_id"] == data["job_id"]  # idempotent: same input, same job, no second evaluation
    with session_scope() as session:
        assert len(list(session.scalars(select(Score).where(Score.job_id == data["job_id"])))) == 3


def test_concurrent_submissions_and_job_polling(reward_api: str) -> None:
    bodies = [
        {"reference": RELU_REFERENCE, "candidate": source, "options": {"device": "cpu"}, "wait_s": 0}
        for source in (CORRECT, WRONG, CORRECT.replace("BLOCK=1024", "BLOCK=512").replace("1024)", "512)"))
    ]
    with ThreadPoolExecutor(3) as pool:
        submitted = list(pool.map(lambda b: httpx.post(f"{reward_api}/v1/score", json=b, timeout=30), bodies))
    assert all(r.status_code == 202 for r in submitted), [r.text for r in submitted]
    job_ids = {r.json()["job_id"] for r in submitted}
    assert len(job_ids) == 3
    statuses = {}
    deadline = time.monotonic() + 240
    while len(statuses) < 3 and time.monotonic() < deadline:
        for job_id in job_ids - statuses.keys():
            job = httpx.get(f"{reward_api}/v1/jobs/{job_id}", timeout=10).json()
            if job["status"] in ("succeeded", "failed"):
                statuses[job_id] = job["result"]["verdicts"][0]["status"]
        time.sleep(0.5)
    assert sorted(statuses.values()) == ["correct", "correct", "incorrect"]


def test_malformed_request_gets_a_clear_4xx(reward_api: str) -> None:
    response = httpx.post(f"{reward_api}/v1/score/group", json={"reference": RELU_REFERENCE, "candidates": []}, timeout=10)
    assert response.status_code == 422
    assert "candidates" in response.text
    response = httpx.get(f"{reward_api}/v1/jobs/nope", timeout=10)
    assert response.status_code == 404 and "nope" in response.json()["detail"]


def _cli_score(reference: Path, candidate: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    kernelzero = Path(sys.executable).with_name("kernelzero")
    command = [str(kernelzero), "score", "--reference", str(reference), "--candidate", str(candidate), "--device", "cpu"]
    return subprocess.run([*command, *extra], capture_output=True, text=True, timeout=300)


def test_cli_score_json(kz_env: Callable[..., Settings], tmp_path: Path) -> None:
    kz_env()
    reference = tmp_path / "reference.py"
    reference.write_text(RELU_REFERENCE)
    outputs = {}
    for name, source in {"correct": CORRECT, "decoy": HACKS["decoy_scratch_kernel"][0]}.items():
        path = tmp_path / f"{name}.py"
        path.write_text(source)
        run = _cli_score(reference, path, "--backend", "triton", "--json")
        assert run.returncode == 0, run.stderr
        outputs[name] = json.loads(run.stdout)
    assert outputs["correct"]["status"] == "correct" and outputs["correct"]["correct"] is True
    assert outputs["correct"]["speedup"] is None and outputs["correct"]["reward"] == 1.0
    assert outputs["decoy"]["status"] == "rejected" and outputs["decoy"]["guard"] == "decoy_kernel"
    for key in ("status", "correct", "reason", "reward", "speedup", "runtime_ms", "ref_runtime_ms", "max_abs_error"):
        assert key in outputs["decoy"]


def test_cli_scores_on_the_running_service(
    platform_env: Callable[..., Settings],
    start_worker,  # type: ignore[no-untyped-def]
    free_port: Callable[[], int],
    tmp_path: Path,
) -> None:
    """``kernelzero score --service``: the verdict is the reward service's job's (its worker's warm children),
    at the settings' reward URL, the same as the API's record of it."""
    port = free_port()
    platform_env(auth_enabled="false", reward_warm_children=1, reward_port=port)
    start_worker("reward")
    reference = tmp_path / "reference.py"
    reference.write_text(RELU_REFERENCE)
    seen = {}
    with serve("reward_svc.api:app", port) as url:
        for name, source in {"correct": CORRECT, "wrong": WRONG}.items():
            path = tmp_path / f"{name}.py"
            path.write_text(source)
            run = _cli_score(reference, path, "--service", "--json")
            assert run.returncode == 0, run.stderr
            job_id = run.stderr.split("job ", 1)[1].split()[0]
            assert f"on {url}" in run.stderr
            job = httpx.get(f"{url}/v1/jobs/{job_id}", timeout=10).json()
            assert job["status"] == "succeeded"
            seen[name] = json.loads(run.stdout), job["result"]["verdicts"][0]
    for verdict, recorded in seen.values():
        assert {k: verdict[k] for k in ("status", "reason", "reward")} == {k: recorded[k] for k in ("status", "reason", "reward")}
    assert seen["correct"][0]["status"] == "correct" and seen["wrong"][0]["status"] == "incorrect"


def test_cli_score_on_a_service_that_does_not_answer_says_where_and_what_to_do(
    kz_env: Callable[..., Settings], free_port: Callable[[], int], tmp_path: Path
) -> None:
    port = free_port()
    kz_env(reward_port=port)
    (tmp_path / "reference.py").write_text(RELU_REFERENCE)
    (tmp_path / "candidate.py").write_text(CORRECT)
    run = _cli_score(tmp_path / "reference.py", tmp_path / "candidate.py", "--service")
    assert run.returncode == 1
    assert f"no verdict from the reward service at http://127.0.0.1:{port}" in " ".join(run.stderr.split())
    assert "kernelzero up" in run.stderr and "Traceback" not in run.stderr


def test_a_gpu_hosts_reward_worker_runs_groups_at_once_in_threads(
    platform_env: Callable[..., Settings],
    start_worker,  # type: ignore[no-untyped-def]
    free_port,
) -> None:
    """Configured for one GPU, the worker takes score.gpu0 with a threads pool sharing one evaluator.
    Here the groups run on the CPU, which is enough to see two of them in flight at once."""
    from services.db.models import Job

    platform_env(auth_enabled="false", gpu_devices="[0]", reward_gpu_concurrency=2, reward_warm_children=2)
    worker = start_worker("reward")
    assert "--pool threads -c 2" in " ".join(worker.popen.args)  # type: ignore[arg-type]
    body = {"reference": RELU_REFERENCE, "options": {"device": "cpu"}, "wait_s": 0}
    with serve("reward_svc.api:app", free_port()) as url:
        submitted = [
            httpx.post(f"{url}/v1/score", json={**body, "candidate": source}, timeout=30).json()["job_id"]
            for source in (CORRECT, CORRECT.replace("BLOCK=1024", "BLOCK=512").replace("1024)", "512)"))
        ]
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            jobs = [httpx.get(f"{url}/v1/jobs/{job_id}", timeout=10).json() for job_id in submitted]
            if all(job["status"] in ("succeeded", "failed") for job in jobs):
                break
            time.sleep(0.5)
    assert [job["status"] for job in jobs] == ["succeeded", "succeeded"], [(job["status"], job["error"]) for job in jobs]
    assert [job["result"]["verdicts"][0]["status"] for job in jobs] == ["correct", "correct"], jobs
    with session_scope() as session:
        first, second = sorted((session.get(Job, job_id) for job_id in submitted), key=lambda j: j.started_at)
        assert first.queue == second.queue == "score.gpu0"
        assert second.started_at < first.finished_at, "the second group waited for the first"
