"""What a deployment relies on at run time, with real processes: a worker that must sandbox with
bubblewrap refuses to start without it, workers and APIs export Prometheus metrics after real jobs, and
concurrent migrations (every pod's init step) do not trip over each other."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine, inspect

from conftest import WorkerProcess
from reward_cases import CORRECT, HACKS, RELU_REFERENCE
from servers import serve
from services.cli.launcher import platform_commands
from services.config import Settings, get_settings
from services.queue.jobs import submit_job, wait_until_done
from services.queue.names import probe_task_name
from services.sandbox.bwrap import bwrap_probe

ROOT = Path(__file__).resolve().parents[1]
BROKEN_BWRAP = "#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n"


def samples(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a /metrics page, keyed by name and labels."""
    text = httpx.get(url, timeout=10).text
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(page: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float | None:
    return page.get((name, frozenset(labels.items())))


def wait_for_metrics(url: str, timeout_s: float = 30) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return samples(url)
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.mark.parametrize("service", ["reward", "proposer", "coder"])
def test_a_sandboxing_worker_refuses_to_start_when_bwrap_is_required_and_broken(
    service: str, platform_env: Callable[..., Settings], tmp_path: Path
) -> None:
    """A deployed worker never reports ``isolation: fallback``: under KZ_SANDBOX=bwrap a bubblewrap
    that fails its probe (as in a container whose seccomp profile refuses user namespaces) stops the
    worker before it takes a job, with the reason in one line."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "bwrap").write_text(BROKEN_BWRAP)
    (fake / "bwrap").chmod(0o755)
    command = next(p.command for p in platform_commands(get_settings(), (service,)) if p.name.endswith("worker"))
    env = dict(os.environ) | {"KZ_SANDBOX": "bwrap", "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output[-3000:]
    assert (
        f"{service} worker refuses to start: KZ_SANDBOX=bwrap but bubblewrap does not work here: "
        "bwrap probe exited 1: bwrap: setting up uid map: Permission denied"
    ) in output
    assert " ready." not in output
    assert "Traceback" not in output  # one line a log collector shows whole


def test_the_default_sandbox_choice_still_starts_a_worker_without_bwrap(
    start_worker: Callable[..., WorkerProcess], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Local use is unchanged: with KZ_SANDBOX unset (auto) a broken bwrap means the fallback, not a refusal."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "bwrap").write_text(BROKEN_BWRAP)
    (fake / "bwrap").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    worker = start_worker("proposer")
    events = [json.loads(line) for line in worker.log().splitlines() if line.startswith("{")]
    assert {"event": "worker.isolation", "mode": "fallback", "required": "auto"}.items() <= next(
        e for e in events if e["event"] == "worker.isolation"
    ).items()


def test_a_prefork_worker_exports_job_and_queue_metrics_after_a_real_job(
    start_worker: Callable[..., WorkerProcess], free_port: Callable[[], int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    multiproc = tmp_path / "prometheus"
    multiproc.mkdir()
    # As deployed: the job runs in a pool process, which writes its samples where the main process's server reads them.
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(multiproc))
    # What a container that died left in its pod's volume: five finished probes that must not count again.
    stale = "from services.metrics import JOBS\nfor _ in range(5): JOBS.labels('trainer', 'trainer.probe', 'succeeded').inc()"
    subprocess.run([sys.executable, "-c", stale], check=True, timeout=60)
    assert list(multiproc.glob("counter_*.db"))
    start_worker("trainer", metrics_port=port)
    job = submit_job(probe_task_name("trainer"), {"token": "metrics"}, queue="training")
    assert wait_until_done(job.id, 60).status == "succeeded"
    page = wait_for_metrics(f"http://127.0.0.1:{port}/metrics")
    labels = {"service": "trainer", "kind": "trainer.probe"}
    assert value(page, "kernelzero_jobs_total", outcome="succeeded", **labels) == 1
    assert value(page, "kernelzero_job_duration_seconds_count", **labels) == 1
    assert value(page, "kernelzero_queue_depth", queue="training") == 0
    assert value(page, "kernelzero_broker_up") == 1
    # No NVML here: no GPU series at all, rather than zeros that would read as an idle GPU.
    assert not any(name.startswith("kernelzero_gpu_") for name, _ in page)


@pytest.mark.slow
def test_reward_worker_and_api_export_verdicts_isolation_sandbox_runs_and_queue_depth(
    platform_env: Callable[..., Settings],
    start_worker: Callable[..., WorkerProcess],
    free_port: Callable[[], int],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mode = "bwrap" if bwrap_probe()[0] is not None else "fallback"
    worker_port, api_port = free_port(), free_port()
    platform_env(auth_enabled="false", reward_warm_children=1)
    (tmp_path / "prometheus").mkdir()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "prometheus"))
    start_worker("reward", sandbox=mode, metrics_port=worker_port)
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR")  # a worker's setting: the API is one process
    body = {
        "reference": RELU_REFERENCE,
        "candidates": [CORRECT, HACKS["kernel_never_launched"][0]],
        "options": {"device": "cpu"},
        "wait_s": 150,
    }
    with serve("reward_svc.api:app", api_port) as api:
        response = httpx.post(f"{api}/v1/score/group", json=body, timeout=180)
        assert response.status_code == 200 and response.json()["job_status"] == "succeeded", response.text
        api_page = samples(f"{api}/metrics")
    assert value(api_page, "kernelzero_queue_depth", queue="score.cpu") == 0
    page = samples(f"http://127.0.0.1:{worker_port}/metrics")
    assert value(page, "kernelzero_verdicts_total", status="correct", guard="none") == 1
    assert value(page, "kernelzero_verdicts_total", status="rejected", guard="no_custom_kernel") == 1
    assert value(page, "kernelzero_sandbox_isolation", service="reward", mode=mode) == 1
    assert value(page, "kernelzero_jobs_total", service="reward", kind="reward.score_group", outcome="succeeded") == 1
    ended = sum(
        v for (name, labels), v in page.items() if name == "kernelzero_sandbox_runs_total" and ("isolation", mode) in labels
    )
    assert ended >= 1  # the evaluation's children ended and were counted


@pytest.mark.postgres
def test_migrations_started_together_on_postgres_all_succeed(postgres_url: str) -> None:
    """Every pod's init container runs ``kernelzero db upgrade`` at once on a new database: the advisory
    lock lets one migrate while the others wait and then find nothing to do."""
    env = dict(os.environ) | {"KZ_DATABASE_URL": postgres_url}
    command = [sys.executable, "-c", "from kernelzero.cli import app; app()", "db", "upgrade"]
    with ThreadPoolExecutor(4) as pool:
        runs = list(pool.map(lambda _: subprocess.run(command, env=env, capture_output=True, text=True, timeout=180), range(4)))
    for run in runs:
        assert run.returncode == 0, run.stderr[-3000:]
    engine = create_engine(postgres_url)
    try:
        tables = set(inspect(engine).get_table_names())
    finally:
        engine.dispose()
    assert {"jobs", "alembic_version"} <= tables


def test_the_compose_health_check_passes_for_a_live_worker_and_fails_once_it_is_gone(
    start_worker: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    """The worker health check as compose runs it (``celery inspect ping`` of the worker's node name)."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    check = compose["services"]["trainer-worker"]["healthcheck"]["test"]
    assert check[0] == "CMD-SHELL"
    shim = tmp_path / "bin"  # the image's `celery`: this interpreter's, whatever the venv's scripts point at
    shim.mkdir()
    (shim / "celery").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m celery "$@"\n')
    (shim / "celery").chmod(0o755)
    env = dict(os.environ) | {
        "PATH": f"{shim}{os.pathsep}{os.environ['PATH']}",
        "KZ_REDIS_URL": get_settings().redis_url,
        "HOSTNAME": socket.gethostname(),  # the container's hostname, which %h in -n expands to
    }
    worker = start_worker("trainer")  # named trainer@%h, as compose names it

    def health() -> int:
        return subprocess.run(["sh", "-c", check[1].replace("$$", "$")], env=env, capture_output=True, timeout=60).returncode

    assert health() == 0
    worker.stop()
    assert health() != 0


def test_trainer_steps_and_the_served_version_reach_the_metrics(platform_env: Callable[..., Settings], tmp_path: Path) -> None:
    """What the trainer's worker and the coder's export (in their own process: read from its registry here)."""
    from prometheus_client import REGISTRY

    from services.db.models import TrainingRun
    from services.db.session import session_scope
    from services.metrics import record_served_version
    from trainer.records import RunRecorder

    with session_scope() as session:
        run = TrainingRun(config={}, run_dir=str(tmp_path / "run"))
        session.add(run)
        session.flush()
        run_id = run.id
    steps = {"role": "proposer"}
    before = REGISTRY.get_sample_value("kernelzero_trainer_steps_total", steps) or 0
    RunRecorder(run_id, tmp_path / "run").step(
        0, 3, {"loss": 0.25, "reward_mean": 0.5, "note": "text is not a sample"}, role="proposer"
    )
    assert REGISTRY.get_sample_value("kernelzero_trainer_steps_total", steps) == before + 1
    assert REGISTRY.get_sample_value("kernelzero_trainer_step_value", {"role": "proposer", "name": "loss"}) == 0.25
    assert REGISTRY.get_sample_value("kernelzero_trainer_step_value", {"role": "proposer", "name": "note"}) is None
    record_served_version("coder", "openai", "coder-v12")
    assert REGISTRY.get_sample_value("kernelzero_model_version_served", {"role": "coder", "backend": "openai"}) == 12
    record_served_version("coder", "openai", None)  # back to the base model
    assert REGISTRY.get_sample_value("kernelzero_model_version_served", {"role": "coder", "backend": "openai"}) == 0
