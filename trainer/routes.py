"""Trainer HTTP routes: thin: a run's configuration in, the run service, the run out."""

from __future__ import annotations

from fastapi import APIRouter, Depends, HTTPException

from services.api.errors import error_answers
from services.api.strict_json import StrictJSONRoute
from services.auth import require_api_key
from services.schemas.trainer import RunOut
from trainer import runs
from trainer.config import ConfigError, LoopConfig

router = APIRouter(tags=["trainer"], dependencies=[Depends(require_api_key)], route_class=StrictJSONRoute)


@router.post("/runs", response_model=RunOut, status_code=201, responses=error_answers(400))
def submit_run(config: LoopConfig) -> RunOut:
    """Check the run's configuration (a model path that is not there, a LoRA target that matches no
    module: 400 with the reason) and queue its first round."""
    try:
        return runs.submit_run(config)
    except ConfigError as exc:
        raise HTTPException(400, f"config refused: {exc}") from None


@router.get("/runs/{run_id}", response_model=RunOut, responses=error_answers(404))
def get_run(run_id: str) -> RunOut:
    """Where the run stands, with every step's and round's figures."""
    try:
        return runs.get_run(run_id)
    except runs.RunNotFound:
        raise HTTPException(404, f"no run with id {run_id}") from None


@router.delete("/runs/{run_id}", response_model=RunOut, responses=error_answers(404))
def cancel_run(run_id: str) -> RunOut:
    """Stop the run: at once if queued, else at its next task or step; what it published stays."""
    try:
        return runs.cancel_run(run_id)
    except runs.RunNotFound:
        raise HTTPException(404, f"no run with id {run_id}") from None
