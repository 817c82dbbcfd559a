"""Client of the trainer service: submit a run of the alternating loop, follow it, cancel it."""

from __future__ import annotations

from typing import Any

from services.clients.base import AsyncServiceClient, ClientConfig, Flow, Send, ServiceClient, ask, flow_method
from services.schemas.trainer import RunOut


class TrainerRoutes(ClientConfig):
    """The trainer service's routes, written once for ``TrainerClient`` and ``AsyncTrainerClient``."""

    service = "trainer"

    @flow_method
    def submit_run(self, config: dict[str, Any]) -> Flow[RunOut]:
        """``config``: a ``LoopConfig``'s fields; refused (``ServiceError``, 400) with the reason."""
        response = yield from ask(Send("POST", "/v1/runs", json=config))
        return RunOut.model_validate(response.json())

    @flow_method
    def run(self, run_id: str) -> Flow[RunOut]:
        response = yield from ask(Send("GET", f"/v1/runs/{run_id}"))
        return RunOut.model_validate(response.json())

    @flow_method
    def cancel_run(self, run_id: str) -> Flow[RunOut]:
        response = yield from ask(Send("DELETE", f"/v1/runs/{run_id}"))
        return RunOut.model_validate(response.json())


class TrainerClient(TrainerRoutes, ServiceClient):
    """The trainer service, blocking."""


class AsyncTrainerClient(TrainerRoutes, AsyncServiceClient):
    """The trainer service, for asyncio."""
