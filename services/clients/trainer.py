"""Client of the trainer service: submit a run of the alternating loop, follow it, cancel it."""

from __future__ import annotations

from typing import Any

from services.clients.base import ServiceClient
from services.schemas.trainer import RunOut


class TrainerClient(ServiceClient):
    service = "trainer"

    def submit_run(self, config: dict[str, Any]) -> RunOut:
        """``config``: a ``LoopConfig``'s fields; refused (``ServiceError``, 400) with the reason."""
        return RunOut.model_validate(self.request("POST", "/v1/runs", json=config).json())

    def run(self, run_id: str) -> RunOut:
        return RunOut.model_validate(self.request("GET", f"/v1/runs/{run_id}").json())

    def cancel_run(self, run_id: str) -> RunOut:
        return RunOut.model_validate(self.request("DELETE", f"/v1/runs/{run_id}").json())
