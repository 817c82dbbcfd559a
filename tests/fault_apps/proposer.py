"""The proposer worker with every module found valid without its sandboxed run (the composer is real)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from proposer_svc import service
from proposer_svc.service import run_propose_job
from proposer_svc.validate import ValidationResult
from services.queue.names import PROPOSE_TASK
from services.queue.worker import create_worker_app


class ValidWithoutRunning:
    """Stands in for ``proposer_svc.validate.Validator``."""

    def __init__(self, *_: Any) -> None:
        pass

    def __enter__(self) -> ValidWithoutRunning:
        return self

    def __exit__(self, *_: object) -> None:
        pass

    def validate_many(
        self,
        sources: Sequence[str],
        known_hashes: Iterable[str] = (),
        parallel: int = 1,
        on_result: Callable[[int, ValidationResult], None] | None = None,
    ) -> list[ValidationResult]:
        return [ValidationResult(valid=True, reason="valid (a stand-in: not run)") for _ in sources]


service.Validator = ValidWithoutRunning
app = create_worker_app("proposer", {PROPOSE_TASK: run_propose_job})
