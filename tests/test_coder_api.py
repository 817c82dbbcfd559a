"""The Coder API end to end: real uvicorn servers for the coder and the reward service, real Celery
workers for both (the coder worker scores over HTTP), real Redis, SQLite; the template generator."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from reward_cases import RELU_REFERENCE
from services.clients import CoderClient, RewardClient
from services.db.models import Candidate, ModelVersion, Score, Task
from services.db.session import session_scope
from services.schemas.coder import KernelRequest
from services.schemas.reward import ScoreOptions
from services.schemas.serving import ModelSwitch
from tiny_lm import build_lora
from trainer.tiny_model import build_tiny_lm


def test_relu_module_gets_a_verified_kernel(coder_api: str) -> None:
    body = {"module": RELU_REFERENCE, "backend": "triton", "n": 2, "wait_s": 150, "scoring": {"device": "cpu"}}
    response = httpx.post(f"{coder_api}/v1/kernels", json=body, timeout=180)
    assert response.status_code == 200, response.text
    data = response.json()
    assert data["job_status"] == "succeeded", data
    result = data["result"]
    assert result["correct"] is True and "@triton.jit" in result["kernel"] and "class ModelNew" in result["kernel"]
    assert result["speedup"] is None  # CPU: speed not measured, never invented
    assert result["model"] == "template" and result["reward_job_id"]
    assert 1 <= len(result["candidates"]) <= 2  # up to n: the deterministic template has one to give
    assert all(c["verdict"]["status"] == "correct" and c["verdict"]["reason"] for c in result["candidates"])

    again = httpx.get(f"{coder_api}/v1/kernels/{data['job_id']}", timeout=10).json()
    assert again["result"] == result

    distinct = {c["source"] for c in result["candidates"]}
    with session_scope() as session:
        task = session.scalars(select(Task).where(Task.source == RELU_REFERENCE)).one()
        rows = session.scalars(select(Candidate).join(Score).where(Score.job_id == result["reward_job_id"])).all()
        assert task.origin == "coder-request"
        assert len(rows) == len(distinct)  # the reward service's rows, annotated, not a second copy
        written_by = f"template@{result['candidates'][0]['model_version']}"  # the served model's name and version
        assert all(r.task_id == task.id and r.model_name == written_by for r in rows), [r.model_name for r in rows]
        assert all(r.details["coder_job_id"] == data["job_id"] for r in rows)
        assert sorted(i for r in rows for i in r.details["draft_indices"]) == list(range(len(result["candidates"])))

    # The client the worker scores with, when the route answers 202 at once: it polls the job.
    kernel = (Path(__file__).parent / "kernels" / "relu" / "triton_correct.py").read_text()
    with RewardClient() as client:
        client.route_wait_s = 0  # the route answers 202 at once; the client polls the job
        single = client.score(RELU_REFERENCE, kernel, ScoreOptions(device="cpu"), wait_s=120)
        group = client.score_group(RELU_REFERENCE, [kernel, "class ModelNew(:"], ScoreOptions(device="cpu"), wait_s=120)
    assert single.job_status == "succeeded" and single.verdict is not None and single.verdict.status == "correct"
    assert group.result is not None and [v.status for v in group.result.verdicts] == ["correct", "compile_error"]


def test_bad_input_and_unknown_ids(coder_api: str) -> None:
    bad = [
        ({"module": "def get_inputs():\n    return []\n"}, "Model"),
        ({"module": "class Model(:\n"}, "not valid Python"),
        ({"module": RELU_REFERENCE, "n": 0}, "n"),
        ({"module": RELU_REFERENCE, "backend": "opencl"}, "backend"),
        ({"module": RELU_REFERENCE, "model_backend": "gpt"}, "model_backend"),
    ]
    for body, word in bad:
        response = httpx.post(f"{coder_api}/v1/kernels", json=body, timeout=10)
        assert response.status_code == 422, (body, response.text)
        assert word in response.text
    assert httpx.get(f"{coder_api}/v1/kernels/nope", timeout=10).status_code == 404
    probe = httpx.post(f"{coder_api}/v1/probe", json={"token": "t"}, timeout=10).json()
    assert httpx.get(f"{coder_api}/v1/kernels/{probe['id']}", timeout=10).status_code == 404  # a job, but not a kernel job
    assert httpx.post(f"{coder_api}/v1/admin/model", json={"adapter_path": "/x"}, timeout=10).status_code == 422


@pytest.mark.slow
def test_model_switch_reaches_the_next_job(coder_api: str, tmp_path: Path) -> None:
    default = httpx.get(f"{coder_api}/v1/admin/model", timeout=10).json()
    assert default["id"] is None and default["backend"] == "template"
    model_dir = build_tiny_lm(tmp_path / "tiny-lm")
    adapters = {name: build_lora(model_dir, tmp_path / name, seed=i) for i, name in enumerate(("lora-a", "lora-b"))}
    body = {
        "module": RELU_REFERENCE,
        "n": 1,
        "wait_s": 120,
        "model_backend": "hf",
        "sampling": {"max_tokens": 16, "seed": 0},
        "scoring": {"device": "cpu"},
    }
    seen = []
    with CoderClient(base_url=coder_api) as client:
        for name, path in adapters.items():
            switched = client.switch_model(ModelSwitch(name=name, adapter_path=str(path)))
            assert switched.name == name and switched.id is not None
            assert client.serving_model().id == switched.id
            response = client.generate(KernelRequest.model_validate(body))
            assert response.job_status == "succeeded" and response.result is not None, response
            assert response.result.model_version_id == switched.id
            assert response.result.candidates[0].model == name  # the worker switched its loaded model to the adapter
            prompt = response.result.prompt  # once per result, not once per candidate
            assert prompt and prompt[-1]["role"] == "user" and "prompt" not in response.result.candidates[0].details
            seen.append(response.job_id)
    assert seen[0] != seen[1]  # same request under another model is another job
    with session_scope() as session:
        serving = session.scalars(select(ModelVersion).where(ModelVersion.role == "coder", ModelVersion.serving.is_(True))).all()
        assert [v.name for v in serving] == ["lora-b"]
