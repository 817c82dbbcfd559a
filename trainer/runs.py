"""Runs of the alternating loop: created (their configuration checked first), played a round at a
time, read and cancelled. The trainer's routes and ``kernelzero train run`` both come here.

On the queue each round is one job (``trainer.round``, keyed by run and round: delivered twice, it runs
once), and a round that finishes queues the next. A worker killed mid-round leaves its job to be
delivered again (late acknowledgement): the round starts over from the run's last published version.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from services.clients import CoderClient, ProposerClient, ServiceError, ServiceUnreachable
from services.config import get_settings
from services.db.models import ModelVersion, TrainingRun
from services.db.session import session_scope
from services.queue.faults import fault_point
from services.queue.jobs import submit_job
from services.queue.names import TRAIN_ROUND_TASK, TRAINING
from services.schemas.trainer import RecordOut, RunOut
from trainer.config import ConfigError, LoopConfig
from trainer.publish import version_path
from trainer.records import run_records

if TYPE_CHECKING:
    from trainer.loop import Progress

log = structlog.get_logger(__name__)


class RunNotFound(LookupError):
    pass


def create_run(config: LoopConfig, run_dir: Path | None = None) -> str:
    """Store a run after checking what needs the file system (the model, LoRA targets): ``ConfigError``."""
    config.check()
    with session_scope() as session:
        run = TrainingRun(config=config.model_dump(mode="json"), run_dir="", status="queued")
        session.add(run)
        session.flush()
        run.run_dir = str(run_dir or get_settings().data_dir / "runs" / run.id)
        return run.id


def submit_run(config: LoopConfig) -> RunOut:
    """Create the run and queue its first round."""
    run_id = create_run(config)
    _queue_round(run_id, 0)
    return get_run(run_id)


def _queue_round(run_id: str, round_index: int) -> None:
    job = submit_job(TRAIN_ROUND_TASK, {"run_id": run_id, "round": round_index}, TRAINING)
    with session_scope() as session:
        session.get_one(TrainingRun, run_id).job_id = job.id


def get_run(run_id: str) -> RunOut:
    with session_scope() as session:
        run = session.get(TrainingRun, run_id)
        if run is None:
            raise RunNotFound(run_id)
        out = RunOut.model_validate(run)
    out.records = [RecordOut.model_validate(r) for r in run_records(run_id)]
    return out


def cancel_run(run_id: str) -> RunOut:
    """Ask the run to stop: at once if it waits in the queue, else at its next task or step. What it
    published stays."""
    with session_scope() as session:
        run = session.get(TrainingRun, run_id)
        if run is None:
            raise RunNotFound(run_id)
        if run.status in ("queued", "running"):
            run.cancel_requested = True
        if run.status == "queued":
            _finish(run, "cancelled", None)
    return get_run(run_id)


def _finish(run: TrainingRun, status: str, error: str | None) -> None:
    run.status, run.error, run.finished_at = status, error, datetime.now(UTC)


def _cancel_requested(run_id: str) -> bool:
    with session_scope() as session:
        return bool(session.get_one(TrainingRun, run_id).cancel_requested)


def play_round(run_id: str, round_index: int, progress: Progress | None = None) -> bool:
    """Play one round of the run (none if it is done, cancelled, or past this round); whether another
    should follow. A round's failure ends the run with the reason; its last published round stands."""
    from trainer.loop import Cancelled, Checkpoint, LoopError, Services, run_round  # torch: the worker's, not the API's
    from trainer.records import RunRecorder

    with session_scope() as session:
        run = session.get(TrainingRun, run_id)
        if run is None:
            raise RunNotFound(run_id)
        if run.status in ("succeeded", "failed", "cancelled") or run.rounds_done != round_index:
            return False
        if run.cancel_requested:
            _finish(run, "cancelled", None)
            return False
        config = LoopConfig.model_validate(run.config)
        run.status, run.started_at = "running", run.started_at or datetime.now(UTC)
        run_dir = Path(run.run_dir)
        checkpoint = Checkpoint(
            run.rounds_done,
            version_path(session.get(ModelVersion, run.coder_version_id or "")),
            version_path(session.get(ModelVersion, run.proposer_version_id or "")),
        )
    settings = get_settings()
    try:
        with ProposerClient() as proposer, CoderClient() as coder:
            checkpoint, published = run_round(
                config,
                run_id,
                round_index,
                checkpoint,
                Services(proposer, coder),
                settings.data_dir / "models",
                RunRecorder(run_id, run_dir),
                progress=progress,
                cancelled=lambda: _cancel_requested(run_id),
            )
    except Cancelled:
        return _end(run_id, "cancelled", None)
    except (LoopError, ConfigError, ServiceError, ServiceUnreachable, OSError) as exc:  # said plainly: the reason is enough
        log.warning("run.round_failed", run_id=run_id, round=round_index, error=str(exc))
        return _end(run_id, "failed", f"round {round_index + 1}: {type(exc).__name__}: {exc}")
    except Exception as exc:  # a bug of ours: the run still ends with the reason, the trace goes to the log
        log.exception("run.round_crashed", run_id=run_id, round=round_index)
        return _end(run_id, "failed", f"round {round_index + 1}: {type(exc).__name__}: {exc}")
    with session_scope() as session:
        run = session.get_one(TrainingRun, run_id)
        run.rounds_done = checkpoint.rounds_done
        if published.coder is not None:
            run.coder_version_id = published.coder.id
        if published.proposer is not None:
            run.proposer_version_id = published.proposer.id
        more = run.rounds_done < config.rounds and not run.cancel_requested
        if not more:
            _finish(run, "cancelled" if run.cancel_requested else "succeeded", None)
    return more


def _end(run_id: str, status: str, error: str | None) -> bool:
    with session_scope() as session:
        _finish(session.get_one(TrainingRun, run_id), status, error)
    return False


def _next_round_due(run_id: str, round_index: int) -> bool:
    """Whether the run recorded this round done and waits for the next: what an attempt finds when the
    one before it died between recording the round and queueing the next."""
    with session_scope() as session:
        run = session.get_one(TrainingRun, run_id)
        rounds = LoopConfig.model_validate(run.config).rounds
        return run.status == "running" and run.rounds_done == round_index + 1 < rounds and not run.cancel_requested


def run_round_job(job_id: str, payload: dict[str, Any]) -> dict[str, Any]:
    """The Celery job body: one round, then the next one queued (once: its job is keyed by run and round)."""
    run_id, round_index = payload["run_id"], int(payload["round"])
    play_round(run_id, round_index)
    fault_point("train.after_round")
    # From the run's row, not from what play_round said: an attempt whose predecessor recorded the round
    # and died plays nothing, and the next round must still follow.
    if _next_round_due(run_id, round_index):
        _queue_round(run_id, round_index + 1)
    out = get_run(run_id)
    return {"run_id": run_id, "round": round_index, "status": out.status, "rounds_done": out.rounds_done}
