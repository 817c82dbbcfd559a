"""The HTTP face every service shares: health, readiness, API-key auth, metrics, OpenAPI.

In-process (FastAPI's TestClient) against a real migrated SQLite database and the real Redis.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY

from services import auth
from services.api.app import create_service_app
from services.config import Settings
from services.db.models import Job
from services.db.session import session_scope


def service_app() -> FastAPI:
    """A fresh app after the settings changed (the module-level apps were built at import)."""
    return create_service_app("trainer")


def add_job(job_id: str = "job-1") -> str:
    with session_scope() as session:
        session.add(Job(id=job_id, kind="trainer.probe", queue="training", idempotency_key=job_id.ljust(64, "0"), payload={}))
    return job_id


def test_healthz_needs_no_key_and_no_dependencies(kz_env: Callable[..., Settings], free_port: Callable[[], int]) -> None:
    kz_env(redis_url=f"redis://127.0.0.1:{free_port()}/0", auth_enabled=True)
    response = TestClient(service_app()).get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "service": "trainer"}
    assert response.headers["x-request-id"]


def test_readyz_200_when_database_and_redis_answer(platform_env: Callable[..., Settings]) -> None:
    response = TestClient(service_app()).get("/readyz")
    assert response.status_code == 200, response.text
    assert response.json() == {"ready": True, "checks": {"database": "ok", "redis": "ok"}}


def test_readyz_503_when_redis_is_down(platform_env: Callable[..., Settings], free_port: Callable[[], int]) -> None:
    platform_env(redis_url=f"redis://127.0.0.1:{free_port()}/0")
    response = TestClient(service_app()).get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["ready"] is False
    assert body["checks"]["database"] == "ok"
    assert body["checks"]["redis"].startswith("error: ConnectionError")


def test_readyz_503_when_database_is_down(platform_env: Callable[..., Settings], free_port: Callable[[], int]) -> None:
    platform_env(database_url=f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/none")
    response = TestClient(service_app()).get("/readyz")
    assert response.status_code == 503
    checks = response.json()["checks"]
    assert checks["redis"] == "ok"
    assert checks["database"].startswith("error: OperationalError")


def test_api_keys_gate_v1_routes(platform_env: Callable[..., Settings]) -> None:
    platform_env(auth_enabled=True)
    job_id = add_job()
    _, valid = auth.create_api_key("valid")
    revoked_key, revoked = auth.create_api_key("revoked")
    assert auth.revoke_api_key(revoked_key.prefix) is not None
    client = TestClient(service_app())
    path = f"/v1/jobs/{job_id}"

    missing = client.get(path)
    assert missing.status_code == 401
    assert "missing API key" in missing.json()["detail"]
    for wrong in (revoked, valid + "x", "kz_unknown"):
        answer = client.get(path, headers={"Authorization": f"Bearer {wrong}"})
        assert answer.status_code == 401, wrong
        assert answer.json()["detail"] == "invalid or revoked API key"
    ok = client.get(path, headers={"Authorization": f"Bearer {valid}"})
    assert ok.status_code == 200, ok.text
    assert ok.json()["id"] == job_id and ok.json()["status"] == "queued"
    assert client.get(path, headers={"X-API-Key": valid}).status_code == 200
    assert client.get("/v1/jobs/no-such-job", headers={"X-API-Key": valid}).status_code == 404


def test_switching_the_serving_model_needs_an_admin_key(platform_env: Callable[..., Settings]) -> None:
    platform_env(auth_enabled=True)
    from coder_svc.api import app as coder_app

    _, plain = auth.create_api_key("ci")
    _, admin = auth.create_api_key("operator", admin=True)
    client = TestClient(coder_app)
    switch = {"name": "kernel-coder", "adapter_path": None}
    assert client.get("/v1/admin/model", headers={"X-API-Key": plain}).status_code == 200  # reading is for every key
    refused = client.post("/v1/admin/model", json=switch, headers={"X-API-Key": plain})
    assert refused.status_code == 403 and "admin API key" in refused.json()["detail"]
    assert client.post("/v1/admin/model", json=switch, headers={"X-API-Key": "kz_unknown"}).status_code == 401
    accepted = client.post("/v1/admin/model", json=switch, headers={"X-API-Key": admin})
    assert accepted.status_code == 200, accepted.text
    assert accepted.json()["name"] == "kernel-coder"


def test_keys_are_stored_hashed_and_listed(platform_env: Callable[..., Settings]) -> None:
    key, plaintext = auth.create_api_key("ci")
    stored = {k.id: k for k in auth.list_api_keys()}[key.id]
    assert plaintext.startswith(auth.KEY_PREFIX) and stored.prefix == plaintext[:10]
    assert stored.key_hash == auth.hash_key(plaintext) and plaintext not in stored.key_hash
    assert auth.is_valid_key(plaintext)
    auth.revoke_api_key(key.id)
    assert not auth.is_valid_key(plaintext)


def test_auth_disabled_lets_anonymous_requests_through(platform_env: Callable[..., Settings]) -> None:
    platform_env(auth_enabled=False)
    job_id = add_job()
    assert TestClient(service_app()).get(f"/v1/jobs/{job_id}").status_code == 200


@pytest.fixture
def http_metrics_unclaimed() -> None:
    """The instrumentator registers its HTTP metrics in prometheus_client's process-wide registry when an
    app serves its first request; an app built later in the same process finds the names taken and
    records nothing. A service process has one app; a test process has many (test_foundation_jobs' app
    may have served first): take the HTTP metrics out of the registry so this test's app claims them."""
    claimed = {collector for name, collector in REGISTRY._names_to_collectors.items() if name.startswith("http_")}
    for collector in claimed:
        REGISTRY.unregister(collector)


def test_metrics_and_openapi(platform_env: Callable[..., Settings], http_metrics_unclaimed: None) -> None:
    client = TestClient(service_app())
    client.get("/healthz")
    metrics = client.get("/metrics")
    assert metrics.status_code == 200
    assert 'http_requests_total{handler="/healthz"' in metrics.text
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/healthz", "/readyz", "/v1/jobs/{job_id}", "/v1/probe"} <= set(paths)


@pytest.mark.parametrize("body", [{}, {"token": "t", "sleep_s": -1}, {"token": "t", "sleep_s": 601}])
def test_probe_rejects_bad_input_with_reasons(platform_env: Callable[..., Settings], body: dict[str, object]) -> None:
    platform_env(auth_enabled=False)
    response = TestClient(service_app()).post("/v1/probe", json=body)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"][:2] == ["body", "token" if not body else "sleep_s"]


def test_apikey_cli_creates_admin_keys_on_request(platform_env: Callable[..., Settings]) -> None:
    from typer.testing import CliRunner

    from kernelzero.cli import app

    runner = CliRunner()
    plain, admin = (runner.invoke(app, ["apikey", "create", name, *flags]) for name, flags in (("ci", []), ("ops", ["--admin"])))
    assert plain.exit_code == 0 and admin.exit_code == 0, plain.output + admin.output
    created = [auth.active_key(result.output.strip().splitlines()[-1]) for result in (plain, admin)]  # the key is the last line
    assert [(key.name, key.admin) for key in created if key is not None] == [("ci", False), ("ops", True)]
    listing = runner.invoke(app, ["apikey", "list"]).output
    assert "admin" in listing and "yes" in listing


@pytest.mark.parametrize("package", ["reward_svc", "coder_svc", "proposer_svc", "trainer"])
def test_an_api_process_does_not_load_torch(package: str) -> None:
    """The APIs validate and enqueue; torch (seconds to import, hundreds of MB) belongs to the workers."""
    import subprocess
    import sys

    probe = f"import sys, {package}.api; print(sorted(m for m in ('torch', 'transformers', 'triton') if m in sys.modules))"
    ran = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert ran.stdout.split() == ["[]"]
