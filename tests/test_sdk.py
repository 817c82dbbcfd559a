"""The Python SDK (``services.clients``) over real HTTP: blocking and asyncio faces of one definition
against a running reward service; retries on no connection, 429 (its Retry-After waited out) and 5xx;
timeouts; job polling; the server's reason on an error. And the OpenAPI documents the SDK follows:
stable operation ids, an example on every request body, a description on every field."""

from __future__ import annotations

import asyncio
import importlib
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from reward_cases import CORRECT, RELU_REFERENCE, candidate
from services.clients import AsyncRewardClient, RetryPolicy, RewardClient, ServiceError, ServiceUnreachable
from services.schemas.reward import ScoreOptions

WRONG = candidate("out = torch.empty_like(x)\nlaunch_relu(x, out)\nreturn out + 1.0")
CPU = ScoreOptions(device="cpu")
FAST_RETRY = RetryPolicy(max_retries=3, initial_backoff_s=0.05, max_backoff_s=0.2)


def test_blocking_and_async_clients_score_one_group_as_one_job(reward_service: str) -> None:
    with RewardClient(reward_service) as client:
        blocking = client.score_group(RELU_REFERENCE, [CORRECT, WRONG], CPU, wait_s=180)

    async def score() -> Any:
        async with AsyncRewardClient(reward_service) as client:
            return await client.score_group(RELU_REFERENCE, [CORRECT, WRONG], CPU, wait_s=180)

    concurrent = asyncio.run(score())
    assert blocking.job_status == "succeeded", blocking.error
    assert blocking.result is not None and concurrent.result is not None
    assert [v.status for v in blocking.result.verdicts] == ["correct", "incorrect"], blocking.result.verdicts[1].reason
    assert [v.reward for v in blocking.result.verdicts] == [1.0, 0.0]
    assert concurrent.job_id == blocking.job_id  # the same group is the same job, whichever face sent it
    assert concurrent.result.verdicts == blocking.result.verdicts


def test_a_wait_longer_than_the_route_holds_polls_the_job(reward_service: str) -> None:
    class ImpatientRoute(RewardClient):
        route_wait_s = 0.0  # the route answers 202 at once: the verdict comes from polling /v1/jobs

    with ImpatientRoute(reward_service) as client:
        answer = client.score(RELU_REFERENCE, CORRECT + "\n# another source, so another job\n", CPU, wait_s=180)
    assert answer.job_status == "succeeded" and answer.verdict is not None
    assert answer.verdict.status == "correct"


def test_errors_carry_the_servers_reason(reward_service: str) -> None:
    with RewardClient(reward_service, retry=FAST_RETRY) as client, pytest.raises(ServiceError) as missing:
        client.get_job("no-such-job")
    assert missing.value.status_code == 404
    assert "no-such-job" in missing.value.detail


@contextmanager
def app_on_port(app: FastAPI, port: int, start_after_s: float = 0.0) -> Iterator[str]:
    """``app`` under uvicorn on ``port``, listening only after ``start_after_s`` (connections refused until then)."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))

    def run() -> None:
        time.sleep(start_after_s)
        server.run()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    if not start_after_s:
        while not server.started:
            time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def flaky_app(failures: list[tuple[int, dict[str, str]]], delay_s: float = 0.0) -> tuple[FastAPI, list[float]]:
    """An app whose /healthz answers each of ``failures`` (status, headers) in turn, then 200; the times of its calls."""
    app = FastAPI()
    calls: list[float] = []

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        calls.append(time.monotonic())
        await asyncio.sleep(delay_s)
        if len(calls) <= len(failures):
            status, headers = failures[len(calls) - 1]
            return JSONResponse({"detail": f"try again ({status})"}, status_code=status, headers=headers)
        return JSONResponse({"status": "ok"})

    return app, calls


def test_429_is_retried_after_the_servers_retry_after(free_port: Any) -> None:
    app, calls = flaky_app([(429, {"Retry-After": "1"}), (503, {})])
    with app_on_port(app, free_port()) as url, RewardClient(url, retry=FAST_RETRY) as client:
        assert client.health() == {"status": "ok"}
    assert len(calls) == 3
    assert calls[1] - calls[0] >= 0.95  # Retry-After: 1, not the 0.05 s backoff
    assert calls[2] - calls[1] < 0.9  # the 503 had none: backoff


def test_async_client_retries_5xx_then_gives_the_last_reason(free_port: Any) -> None:
    app, calls = flaky_app([(502, {})] * 10)

    async def health(url: str) -> Any:
        async with AsyncRewardClient(url, retry=FAST_RETRY) as client:
            return await client.health()

    with app_on_port(app, free_port()) as url, pytest.raises(ServiceError) as failed:
        asyncio.run(health(url))
    assert len(calls) == FAST_RETRY.max_retries + 1
    assert failed.value.status_code == 502 and "try again (502)" in failed.value.detail


def test_no_connection_is_retried_until_the_service_listens(free_port: Any) -> None:
    app, calls = flaky_app([])
    port = free_port()
    patient = RetryPolicy(max_retries=8, initial_backoff_s=0.2, max_backoff_s=0.5)
    with app_on_port(app, port, start_after_s=1.0), RewardClient(f"http://127.0.0.1:{port}", retry=patient) as client:
        assert client.health() == {"status": "ok"}
    assert len(calls) == 1
    with RewardClient(f"http://127.0.0.1:{free_port()}", retry=FAST_RETRY) as client, pytest.raises(ServiceUnreachable) as down:
        client.health()
    assert down.value.connect_failed and "ConnectError" in str(down.value)


def test_a_read_timeout_is_reported_and_not_sent_again(free_port: Any) -> None:
    app, calls = flaky_app([], delay_s=2.0)
    with app_on_port(app, free_port()) as url, RewardClient(url, timeout_s=0.3, retry=FAST_RETRY) as client:
        with pytest.raises(ServiceUnreachable) as slow:
            client.health()
    assert not slow.value.connect_failed and "ReadTimeout" in str(slow.value)
    assert len(calls) == 1


SERVICES = ("proposer_svc", "coder_svc", "reward_svc", "trainer")
OPERATION_IDS = {
    "proposer_svc": {"propose", "list_tasks", "get_task", "frontier", "read_serving_model", "switch_serving_model"},
    "coder_svc": {"request_kernel", "read_kernel", "read_serving_model", "switch_serving_model"},
    "reward_svc": {"score", "score_group", "get_reward"},
    "trainer": {"submit_run", "get_run", "cancel_run"},
}
FASTAPI_OWN = {"HTTPValidationError", "ValidationError"}  # FastAPI's 422 shape, not ours to describe


@pytest.fixture(scope="module")
def documents() -> dict[str, dict[str, Any]]:
    return {service: importlib.import_module(f"{service}.api").app.openapi() for service in SERVICES}


def test_operation_ids_are_the_route_names(documents: dict[str, dict[str, Any]]) -> None:
    for service, document in documents.items():
        ids = [op["operationId"] for path in document["paths"].values() for op in path.values()]
        assert len(ids) == len(set(ids)), service
        assert set(ids) == {"healthz", "readyz", "read_job", "probe"} | OPERATION_IDS[service], service


def test_every_request_body_has_an_example_and_every_field_a_description(documents: dict[str, dict[str, Any]]) -> None:
    undescribed, without_example = [], []
    for service, document in documents.items():
        schemas = document["components"]["schemas"]
        for name, schema in schemas.items():
            if name not in FASTAPI_OWN:
                undescribed += [
                    f"{service}: {name}.{f}" for f, p in schema.get("properties", {}).items() if not p.get("description")
                ]
        for path, operations in document["paths"].items():
            for method, op in operations.items():
                body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
                if body and not schemas[body["$ref"].rsplit("/", 1)[1]].get("examples"):
                    without_example.append(f"{service}: {method.upper()} {path}")
    assert not undescribed, undescribed
    assert not without_example, without_example


def test_docs_pages_load_every_asset_from_the_service_itself(reward_service: str) -> None:
    """The GPU hosts have no network: /docs and /redoc must not reach for a CDN."""
    import re

    import httpx

    for page in ("/docs", "/redoc"):
        html = httpx.get(f"{reward_service}{page}", timeout=10).text
        assets = re.findall(r"""(?:src|href)=["']([^"']+)["']|url: ["']([^"']+)["']""", html)
        urls = {a or b for a, b in assets}
        assert urls and not [u for u in urls if u.startswith(("http:", "https:", "//"))], urls
        for url in urls:
            assert httpx.get(f"{reward_service}{url}", timeout=10).status_code == 200, url
