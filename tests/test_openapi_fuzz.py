"""Schemathesis against every service's OpenAPI, in-process (ASGI): no request the schema allows, nor one
it refuses, is answered 5xx, and every answer conforms to the schema (its status documented, its body
valid against it, its content type and headers as stated).

A regression guard for ``test_hostile_input.py``'s classes of 500s, not a campaign: a few examples per
operation and generation mode, derandomized so every run sends the same requests. No worker runs:
submissions queue in this session's own Redis database and stay queued, and a route's ``wait_s`` is not
waited for (the test is about what the routes answer, not about jobs).
"""

from __future__ import annotations

import importlib
from collections import Counter
from collections.abc import Callable

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error, positive_data_acceptance

from services import auth
from services.api import waiting
from services.cli.launcher import SERVICE_PACKAGES
from services.config import Settings
from services.queue import jobs

EXAMPLES = 10  # per operation and mode: about 25 s for the four services on two cores
# Schema-valid data a route still refuses with a reason the schema cannot state (a module that is not valid
# Python, a model path that is not there) is the design, so "valid data must be accepted" does not apply.
EXCLUDED_CHECKS = [positive_data_acceptance]
# OpenRLHF's /get_reward cannot answer 202 (its client reads only 200, and retries what raise_for_status
# raises): with no worker here its jobs never finish, so it answers its documented 503 "still scoring";
# that it is only that 503 is asserted below.
STILL_SCORING = {"POST /v1/get_reward"}


@pytest.mark.parametrize("service", sorted(SERVICE_PACKAGES))
def test_no_server_error_and_every_answer_conforms(
    service: str, platform_env: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    platform_env(auth_enabled="true")
    _, key = auth.create_api_key("schemathesis", admin=True)  # an admin key reaches every route
    monkeypatch.setattr(waiting, "wait_until_done", lambda job_id, wait_s: jobs.wait_until_done(job_id, 0))
    app = importlib.import_module(f"{SERVICE_PACKAGES[service]}.api").app
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    headers = {"Authorization": f"Bearer {key}"}
    statuses: Counter[int] = Counter()

    def call(case: schemathesis.Case) -> None:
        if case.operation.label in STILL_SCORING:
            response = case.call_and_validate(headers=headers, excluded_checks=[*EXCLUDED_CHECKS, not_a_server_error])
            assert response.status_code < 500 or "still scoring" in response.json()["detail"], response.text
        else:
            response = case.call_and_validate(headers=headers, excluded_checks=EXCLUDED_CHECKS)
        statuses[response.status_code] += 1

    failures = []
    operations = [result.ok() for result in schema.get_all_operations()]
    for operation in operations:
        for mode in schemathesis.GenerationMode:
            test = settings(
                max_examples=EXAMPLES,
                derandomize=True,
                database=None,
                deadline=None,
                suppress_health_check=list(HealthCheck),
            )(given(case=operation.as_strategy(generation_mode=mode))(call))
            try:
                test()
            except Unsatisfiable:
                pass  # no invalid request exists (no parameters, no body): nothing to send in this mode
            except (Exception, BaseExceptionGroup) as exc:  # a failed check, or an error raised out of the app
                notes = "\n".join(getattr(exc, "__notes__", []))  # the falsifying request, as Hypothesis shrank it
                failures.append(f"{operation.label} ({mode}): {type(exc).__name__}: {exc}\n{notes}")
    assert not failures, "\n\n".join(failures)
    assert len(operations) >= 4 and statuses.total() >= 10 * len(operations), (len(operations), statuses)  # it did send
