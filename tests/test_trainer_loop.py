"""The alternating loop end to end on CPU, through the real services: the Proposer's frontier picks the
task, the Coder's worker samples G candidates from a tiny model that writes a correct ReLU kernel
about half the time, the reward service's worker judges them in its sandbox (Triton's interpreter),
the trainer's worker claims the group, takes a CA-GRPO step and publishes a version the Coder then
serves. Also: a run refused at submission with the reason, a queued run cancelled, the figures."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from coder_svc import kernel_messages, system_prompt_for
from reward_cases import CORRECT, RELU_REFERENCE
from servers import serve
from services.clients import CoderClient, ServiceError, TrainerClient
from services.config import Settings
from services.db.models import Job, ModelVersion, RolloutGroup
from services.db.session import session_scope
from services.db.tasks import ensure_task
from services.queue.names import GENERATE_TASK, TRAIN_ROUND_TASK
from services.schemas.coder import KernelRequest
from services.schemas.serving import ServingModel
from services.schemas.trainer import RunOut
from trainer.config import LoopConfig
from trainer.loop import claim_key
from trainer.publish import save_version, serve_version, served_weights
from trainer.runs import create_run, get_run, play_round
from trainer.tiny_model import build_replying_lm, build_tiny_lm

GROUP = 8


def loop_config(model: Path, **fields: object) -> dict[str, object]:
    coder = {"model_path": str(model), "group_size": GROUP, "groups_per_step": 1, "learning_rate": 5e-3, "bf16": False}
    return {
        "coder": coder,
        "rounds": 1,
        "coder_steps": 1,
        "model_backend": "hf",
        "device": "cpu",
        "max_tokens": 8,
        "scoring_timeout_s": 120,
        **fields,
    }


@pytest.mark.slow  # four services' workers and APIs, a tiny model, sandboxed verdicts
def test_rounds_sample_score_train_publish_and_resume_after_a_sigkill(
    coder_api: str,
    platform_env: Callable[..., Settings],
    start_worker: Callable[..., Any],
    free_port: Callable[[], int],
    tmp_path: Path,
) -> None:
    """Two rounds; the trainer's worker process is SIGKILLed in the second while it waits for that
    round's candidates: the round's job comes back, starts over from the first round's version, and
    each group is trained on once."""
    messages = kernel_messages(RELU_REFERENCE, "triton", system_prompt_for("triton"))
    model = build_replying_lm(tmp_path / "tiny-lm", messages, f"```python\n{CORRECT}\n```")  # what the coder worker serves
    task_id = ensure_task(RELU_REFERENCE, "reference")
    proposer_port, trainer_port = free_port(), free_port()
    platform_env(proposer_port=proposer_port, trainer_port=trainer_port)
    worker = start_worker("trainer")
    with serve("proposer_svc.api:app", proposer_port), serve("trainer.api:app", trainer_port), TrainerClient() as trainer:
        submitted = trainer.submit_run(loop_config(model, rounds=2))
        victim = _round_worker_once_generating(submitted.id, round_index=1)
        assert victim in worker.pool_pids()
        os.kill(victim, signal.SIGKILL)
        run = _finished(trainer, submitted.id)
    assert run.status == "succeeded", run.error
    assert run.rounds_done == 2 and run.coder_version_id is not None
    assert worker.popen.poll() is None
    with session_scope() as session:
        attempts = [j.attempts for j in session.scalars(select(Job).where(Job.kind == TRAIN_ROUND_TASK).order_by(Job.created_at))]
        groups = list(session.scalars(select(RolloutGroup).order_by(RolloutGroup.created_at)))
        assert attempts == [1, 2]  # the second round's job, delivered again after its worker died
        assert [(g.task_id, g.claimed_by, g.dropped) for g in groups] == [
            (task_id, f"{run.id}/r0", None),
            (task_id, f"{run.id}/r1", None),
        ]

    rounds = [r for r in run.records if r.kind == "round"]
    steps = [r for r in run.records if r.kind == "step"]
    assert [r.round for r in rounds] == [0, 1] and [(s.round, s.step) for s in steps] == [(0, 0), (1, 0)]
    first, second = (r.metrics for r in rounds)
    assert first["tasks"] == 1 and first["groups"] == 1 and first["candidates"] == GROUP
    assert 0 < first["pass_rate"] < 1  # the tiny model's group carries a signal
    assert first["reward_mean"] == pytest.approx(first["pass_rate"])  # correct: 1, the rest 0 (no speed on CPU)
    assert first["published"] == "coder-v1"
    assert (second["sampled_with"], second["published"]) == ("coder-v1", "coder-v2")  # resumed from the first's version
    assert steps[0].metrics["samples"] == GROUP and steps[0].metrics["tokens"] > 0
    assert set(first["seconds"]) == {"propose", "generate", "train", "publish"}
    jobs = first["generation_job_seconds"]  # the Coder's job says where its time went: sampling, then scoring
    assert jobs["sample"] > 0 and jobs["score"] > 0 and jobs["sample"] + jobs["score"] <= first["seconds"]["generate"] * 1.05
    assert (Path(run.run_dir) / "curves.png").stat().st_size > 0
    assert len((Path(run.run_dir) / "records.jsonl").read_text().splitlines()) == 4

    with CoderClient() as coder:
        serving = coder.serving_model()
        assert (serving.name, serving.id) == ("coder-v2", run.coder_version_id)
        request = {"module": RELU_REFERENCE, "n": 1, "wait_s": 300, "model_backend": "hf", "scoring": {"device": "cpu"}}
        after = coder.generate(KernelRequest.model_validate(request))
    assert after.result is not None and after.result.model_version_id == run.coder_version_id


def _round_worker_once_generating(run_id: str, round_index: int, timeout_s: float = 300) -> int:
    """The pid of the worker process playing the round, once that round's generation job is queued."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with session_scope() as session:
            generating = session.scalars(select(Job).where(Job.kind == GENERATE_TASK)).all()
            round_job = session.scalars(
                select(Job).where(Job.kind == TRAIN_ROUND_TASK, Job.payload["round"].as_integer() == round_index)
            ).first()
            if len(generating) > round_index and round_job is not None and round_job.status == "running" and round_job.worker:
                return int(round_job.worker.rsplit(":", 1)[1])
        time.sleep(0.1)
    raise AssertionError(f"run {run_id} never reached round {round_index + 1}'s generation")


def _finished(trainer: TrainerClient, run_id: str, timeout_s: float = 600) -> RunOut:
    deadline = time.monotonic() + timeout_s
    run = trainer.run(run_id)
    while run.status in ("queued", "running") and time.monotonic() < deadline:
        time.sleep(1)
        run = trainer.run(run_id)
    return run


@pytest.mark.slow  # a trainer API process
def test_runs_that_cannot_work_are_refused_and_a_queued_run_cancels(
    platform_env: Callable[..., Settings], free_port: Callable[[], int], tmp_path: Path
) -> None:
    model = build_tiny_lm(tmp_path / "tiny")
    port = free_port()
    platform_env(trainer_port=port, auth_enabled="false")
    with serve("trainer.api:app", port) as url, TrainerClient() as trainer:
        refusals = {
            "no model there": (loop_config(tmp_path / "nowhere"), 400, "config.json"),
            "a LoRA target it lacks": (
                loop_config(model) | {"coder": {"model_path": str(model), "lora": {"target_modules": ["qkv_proj"]}}},
                400,
                "qkv_proj",
            ),
            "Proposer steps without its settings": (loop_config(model, proposer_steps=2), 422, "needs the Proposer's settings"),
            "a Proposer whose model is not there": (
                loop_config(model, proposer_steps=1, proposer={"model_path": str(tmp_path / "nowhere")}),
                400,
                "config.json",
            ),
            "Proposer RL on the programmatic composer": (
                loop_config(model, proposer_steps=1, composer="composer", proposer={"model_path": str(model)}),
                422,
                "trains the llm composer",
            ),
            "a negative staleness": (
                loop_config(model) | {"coder": {"model_path": str(model), "max_staleness": -1}},
                422,
                "max_staleness",
            ),
        }
        for name, (config, status, reason) in refusals.items():
            response = httpx.post(f"{url}/v1/runs", json=config, timeout=30)
            assert response.status_code == status and reason in response.text, (name, response.status_code, response.text)
        assert httpx.get(f"{url}/v1/runs/nope", timeout=10).status_code == 404

        queued = trainer.submit_run(loop_config(model))  # no trainer worker: it waits in the queue
        assert queued.status == "queued"
        cancelled = trainer.cancel_run(queued.id)
        assert cancelled.status == "cancelled" and cancelled.finished_at is not None
        with pytest.raises(ServiceError, match="404"):
            trainer.cancel_run("nope")


def test_the_command_refuses_a_config_that_cannot_work_in_one_line(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(f"coder:\n  model_path: {tmp_path / 'nowhere'}\nrounds: 2\n")
    done = subprocess.run(
        [sys.executable, "-m", "kernelzero", "train", "run", "--config", str(config), "--proposer-steps", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1 and "config refused" in done.stderr and "needs the Proposer's settings" in done.stderr


def test_a_run_starts_from_the_weights_the_coder_samples_with(tmp_path: Path) -> None:
    """A cold-start adapter (or a published whole model) being served is where training starts, so the
    policy trained is the one that sampled; with nothing published, the base model."""
    model = build_tiny_lm(tmp_path / "tiny")
    configured = ServingModel(name="tiny", backend="hf")
    adapter = ServingModel(id="v1", name="coder-v1", base_model=str(model), adapter_path=str(tmp_path / "coder-v1"), backend="hf")
    whole = ServingModel(id="v1", name="coder-v1", base_model=str(tmp_path / "coder-v1"), backend="hf")
    assert served_weights(configured, adapter=True) is None and served_weights(configured, adapter=False) is None
    assert served_weights(adapter, adapter=True) == tmp_path / "coder-v1"
    assert served_weights(whole, adapter=False) == tmp_path / "coder-v1" and served_weights(whole, adapter=True) is None


@pytest.mark.slow  # a coder API process
def test_a_round_whose_worker_died_after_publishing_stands(
    platform_env: Callable[..., Settings], free_port: Callable[[], int], tmp_path: Path
) -> None:
    """Published and served, then killed before the run counted the round: delivered again, the round
    finds the version it published and stands, not trained a second time on the groups it claimed;
    the Coder keeps one record of the version."""
    port = free_port()
    settings = platform_env(coder_port=port, auth_enabled="false")
    model = build_tiny_lm(tmp_path / "tiny")
    run_id = create_run(LoopConfig.model_validate(loop_config(model, rounds=2)))
    store = settings.data_dir / "models"

    def weights(directory: Path) -> None:
        directory.mkdir(parents=True)
        (directory / "adapter_model.safetensors").write_bytes(b"round 1")

    with serve("coder_svc.api:app", port), CoderClient() as coder:
        version = save_version(weights, store, "coder", origin=claim_key(run_id, 0))  # what the attempt that died wrote
        served = serve_version(version, coder.switch_model, base_model=model, adapter=True)  # and switched to
        assert play_round(run_id, 0)  # delivered again: the next round follows
        assert not play_round(run_id, 0)  # and a third time: nothing to do
        assert coder.serving_model().id == served.id
    run = get_run(run_id)
    assert run.rounds_done == 1 and run.coder_version_id == served.id
    assert sorted(p.name for p in store.iterdir()) == ["coder-v1"]
    assert [(r.kind, r.round, r.metrics.get("recovered")) for r in run.records] == [("round", 0, True)]
    with session_scope() as session:
        assert [v.id for v in session.scalars(select(ModelVersion).where(ModelVersion.name == "coder-v1"))] == [served.id]


README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


@pytest.mark.slow  # the README's commands as a user pastes them: a tiny Coder built offline, two rounds through the services
def test_the_readme_loop_on_a_cpu_trains_a_tiny_coder_through_the_services(
    platform_env: Callable[..., Settings], start_worker: Callable[..., Any], free_port: Callable[[], int], tmp_path: Path
) -> None:
    build = re.search(r"(kernelzero train tiny-model .*?--device cpu)", README, flags=re.S)
    loop_yaml = re.search(r"cat > tiny-loop.yaml <<'YAML'\n(.*?)\nYAML\n", README, flags=re.S)
    assert build and loop_yaml, "the README's tiny-model command and tiny-loop.yaml"
    (tmp_path / "tests").symlink_to(Path(__file__).resolve().parent)  # the README's paths, from the repo root
    command = shlex.split(build.group(1).replace("\\\n", " "))
    built = subprocess.run([sys.executable, "-m", *command], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-2000:]
    model = tmp_path / ".kernelzero" / "tiny-coder"
    assert (model / "config.json").is_file() and "is task" in built.stderr

    ports = {f"{service}_port": free_port() for service in ("proposer", "coder", "reward")}
    platform_env(auth_enabled="false", reward_warm_children=1, **ports)
    start_worker("reward")
    start_worker("coder", coder_model_backend="hf", coder_hf_model_path=model)
    (tmp_path / "tiny-loop.yaml").write_text(loop_yaml.group(1) + "\n")
    with (
        serve("reward_svc.api:app", ports["reward_port"]),
        serve("coder_svc.api:app", ports["coder_port"]),
        serve("proposer_svc.api:app", ports["proposer_port"]),
    ):
        trained = subprocess.run(
            [sys.executable, "-m", "kernelzero", "train", "run", "--config", "tiny-loop.yaml"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=900,
        )
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "coder-v1" in trained.stderr and "coder-v2" in trained.stderr and "succeeded" in trained.stderr
    run_dir = Path(re.findall(r"curves in (\S+curves\.png)", trained.stderr)[-1])
    assert run_dir.stat().st_size > 0
