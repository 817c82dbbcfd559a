"""Hostile input: what an attacker sent at an earlier commit (each answered 500 then, or read whole) is
a 4xx now, answered from the shared app factory for every service.

In-process (FastAPI's TestClient) where the transport does not matter; the body limit and the key gate
are about the transport, so those run against a real uvicorn process (``serve``).
"""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Callable
from urllib.parse import urlparse

import psutil
import pytest
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.testclient import TestClient
from pydantic import ValidationError

from proposer_svc.routes import router as proposer_router
from reward_svc.routes import router as reward_router
from servers import serve
from services import auth
from services.api.app import create_service_app
from services.api.validation_errors import validation_error_answer
from services.config import Settings
from services.schemas.proposer import ProposeRequest
from services.schemas.reward import ScoreOptions

JSON = {"content-type": "application/json"}
MB = 1 << 20


def client(service: str = "reward") -> TestClient:
    """A fresh app after the settings changed; a 500 comes back as a response, not an exception."""
    routers = {"reward": reward_router, "proposer": proposer_router}
    app: FastAPI = create_service_app(service, routers[service])
    return TestClient(app, raise_server_exceptions=False)


@pytest.mark.parametrize(
    "body",
    [
        b'{"token": "t", "sleep_s": NaN}',
        b'{"token": "t", "sleep_s": Infinity}',
        b'{"token": "t", "sleep_s": -Infinity}',
        b'{"token": "\\ud800"}',
        b'{"token": "t", "\\udc00": 1}',
    ],
)
def test_non_json_literals_and_lone_surrogates_are_malformed_json(platform_env: Callable[..., Settings], body: bytes) -> None:
    platform_env(auth_enabled="false")
    response = client().post("/v1/probe", content=body, headers=JSON)
    assert response.status_code == 422, response.text
    [error] = response.json()["detail"]
    assert error["type"] == "json_invalid"
    assert "strict JSON" in error["ctx"]["error"]


def test_the_422_answer_encodes_any_input_and_bounds_it() -> None:
    hostile = {"nan": float("nan"), "inf": float("-inf"), "\ud800": "\udfff" * 10, "big": 10**40, "long": "x" * 10**6}
    error = {"type": "value_error", "loc": ("body", "\ud800"), "msg": "bad", "input": hostile, "ctx": {"error": ValueError("no")}}
    response = pytest.importorskip("asyncio").run(validation_error_answer(None, RequestValidationError([error] * 100)))  # type: ignore[arg-type]
    assert response.status_code == 422
    detail = json.loads(response.body)["detail"]
    assert len(response.body) < 100_000
    assert detail[0]["input"]["nan"] == "nan" and detail[0]["input"]["big"] == "<integer of 133 bits>"
    assert detail[0]["input"]["long"].endswith("(1000000 characters)") and detail[0]["ctx"] == {"error": "no"}


def test_a_huge_invalid_field_is_echoed_cut(platform_env: Callable[..., Settings]) -> None:
    platform_env(auth_enabled="false")
    response = client().post("/v1/score", json={"reference": "x" * 300_000, "candidate": "y"})
    assert response.status_code == 422
    assert len(response.content) < 2_000


def test_an_offset_past_64_bits_is_422_and_the_largest_one_an_empty_page(platform_env: Callable[..., Settings]) -> None:
    platform_env(auth_enabled="false")
    proposer = client("proposer")
    assert proposer.get("/v1/tasks", params={"offset": 2**63}).status_code == 422
    page = proposer.get("/v1/tasks", params={"offset": 2**63 - 1})
    assert page.status_code == 200, page.text
    assert page.json()["items"] == []


def test_booleans_are_no_numbers_yet_integers_are_floats(platform_env: Callable[..., Settings]) -> None:
    platform_env(auth_enabled="false")
    reward = client()
    for body in ({"token": "t", "sleep_s": True}, {"token": "t", "sleep_s": "1"}):
        response = reward.post("/v1/probe", json=body)
        assert response.status_code == 422, (body, response.text)
    with pytest.raises(ValidationError):
        ProposeRequest.model_validate({"count": True})
    with pytest.raises(ValidationError):
        ScoreOptions.model_validate({"atol": 1e400})
    assert ScoreOptions.model_validate({"timeout_s": 1, "trials": 2}).timeout_s == 1.0


def test_a_burst_over_the_quota_is_429_with_retry_after_per_key_and_the_bucket_refills(
    platform_env: Callable[..., Settings],
) -> None:
    # 3 per 9 s: a token comes back every 3 s, so a loaded machine's pause between two requests refills nothing.
    platform_env(auth_enabled="true", quota_scored_candidates=3, quota_window_s=9)
    _, first = auth.create_api_key("first")
    _, second = auth.create_api_key("second")
    reward = client()
    retry_after: list[int] = []

    def score(key: str, candidates: int) -> int:
        body = {"reference": "r", "candidates": [f"c{i}" for i in range(candidates)], "wait_s": 0}
        answer = reward.post("/v1/score/group", json=body, headers={"Authorization": f"Bearer {key}"})
        assert answer.status_code in (202, 429), answer.text
        if answer.status_code == 429:
            retry_after.append(int(answer.headers["retry-after"]))
            assert "quota spent" in answer.json()["detail"]
        return answer.status_code

    assert score(first, 3) == 202
    assert score(first, 1) == 429
    assert 1 <= retry_after[0] <= 3  # the one token missing, at 3 s a token
    assert score(second, 3) == 202  # another key's bucket
    time.sleep(retry_after[0])
    assert score(first, 1) == 202


def test_a_quota_whose_store_does_not_answer_is_503_with_the_reason(kz_env: Callable[..., Settings], free_port) -> None:  # type: ignore[no-untyped-def]
    kz_env(auth_enabled="false", redis_url=f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there
    answer = client().post("/v1/score/group", json={"reference": "r", "candidates": ["c"], "wait_s": 0})
    assert answer.status_code == 503 and "quota store (Redis) does not answer" in answer.json()["detail"]


def upload(url: str, headers: dict[str, str], size: int, *, chunked: bool) -> tuple[int, int]:
    """POST a body of ``size`` bytes, MB by MB, until the server answers (given two seconds to answer from the
    headers alone): its status and the bytes sent by then."""
    where = urlparse(url)
    framing = {"Transfer-Encoding": "chunked"} if chunked else {"Content-Length": str(size)}
    head = "".join(f"{k}: {v}\r\n" for k, v in (headers | framing | JSON).items())
    sent = 0
    with socket.create_connection((where.hostname, where.port), timeout=30) as sock:
        sock.sendall(f"POST /v1/score HTTP/1.1\r\nHost: {where.hostname}\r\n{head}\r\n".encode())
        block = b" " * MB
        try:
            if not select.select([sock], [], [], 2)[0]:
                while sent < size and not select.select([sock], [], [], 0)[0]:
                    sock.sendall(b"%x\r\n%s\r\n" % (len(block), block) if chunked else block)
                    sent += len(block)
        except (BrokenPipeError, ConnectionResetError):
            pass
        return int(sock.recv(4096).split()[1]), sent


def test_a_large_body_is_refused_unread_with_the_server_memory_bounded(
    platform_env: Callable[..., Settings], free_port: Callable[[], int]
) -> None:
    platform_env(auth_enabled="true", max_request_bytes=MB)
    _, key = auth.create_api_key("uploader")
    port = free_port()
    with serve("reward_svc.api:app", port) as url:
        [server] = [p for p in psutil.Process().children() if str(port) in p.cmdline()]
        before = server.memory_info().rss
        keyed = {"Authorization": f"Bearer {key}"}
        # (headers, body size, chunked, status, bytes the client may have sent before the answer)
        for headers, size, chunked, status, most in (
            ({}, MB // 2, False, 401, 0),  # no key: answered from the headers, the body unread
            ({"Authorization": "Bearer kz_wrong"}, 300 * MB, True, 401, 0),
            ({}, 300 * MB, False, 413, 0),  # Content-Length over the limit: refused unread, key or not
            (keyed, 300 * MB, False, 413, 0),
            (keyed, 300 * MB, True, 413, 16 * MB),  # chunked: refused once the limit is passed
        ):
            answered, sent = upload(url, headers, size, chunked=chunked)
            assert (answered, sent <= most) == (status, True), (headers, size, chunked, sent)
        assert server.memory_info().rss - before < 32 * MB
