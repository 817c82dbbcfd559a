"""The platform as ``docker compose up`` starts it (the default profile: Redis with a password,
PostgreSQL, the migrations, four APIs and their workers), under a real Docker engine: every service
comes up healthy behind the migrations, an API key is made as docs/DEPLOY.md says, and a kernel sent to
the reward API over HTTP is scored by the worker's container under bubblewrap.

The APIs publish the compose file's host ports (8101-8104): stop a local ``kernelzero up`` first.
Needs a Docker engine, ``KZ_TEST_IMAGE`` (the CPU image) and the Redis and PostgreSQL images (pulled, or
local stand-ins in ``KZ_TEST_REDIS_IMAGE`` / ``KZ_TEST_POSTGRES_IMAGE``); skipped otherwise, as in CI.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from compose_project import ROOT, ComposeProject, needs_engine_and_image

pytestmark = [pytest.mark.container, needs_engine_and_image]
RELU = ROOT / "tests" / "kernels" / "relu"


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ComposeProject]:
    compose = ComposeProject(tmp_path_factory.mktemp("platform"))
    try:
        compose("up", "--detach", "--wait", "--wait-timeout", "600", "--pull", "never", timeout=900)
        yield compose
    finally:
        compose.down()


def test_every_service_comes_up_healthy_after_the_migrations(platform: ComposeProject) -> None:
    services = [json.loads(line) for line in platform("ps", "--all", "--format", "json").stdout.splitlines() if line.strip()]
    states = {s["Service"]: (s["State"], s.get("Health", ""), s.get("ExitCode")) for s in services}
    assert states.pop("migrate") == ("exited", "", 0)
    expected = {"redis", "postgres"} | {
        f"{name}-{part}" for name in ("proposer", "coder", "reward", "trainer") for part in ("api", "worker")
    }
    assert set(states) == expected
    assert all(state == "running" and health == "healthy" for state, health, _ in states.values()), states


def test_a_kernel_sent_to_the_reward_api_is_scored_under_bubblewrap(platform: ComposeProject) -> None:
    made = platform.run("migrate", "kernelzero", "apikey", "create", "container-test")
    key = next(line.strip() for line in made.splitlines() if line.strip().startswith("kz_"))  # the key's own line
    body = {
        "reference": (RELU / "reference.py").read_text(),
        "candidates": [(RELU / "triton_correct.py").read_text()],
        "wait_s": 300,
    }
    answer = httpx.post(
        "http://127.0.0.1:8103/v1/score/group", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=330
    )
    assert answer.status_code == 200, answer.text
    verdict = answer.json()["result"]["verdicts"][0]
    assert verdict["status"] == "correct", verdict["reason"]
    assert verdict["details"]["isolation"] == "bwrap"
    unauthorised = httpx.post("http://127.0.0.1:8103/v1/score/group", json=body, timeout=30)
    assert unauthorised.status_code == 401
