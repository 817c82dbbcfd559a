"""The trainer worker whose rounds train nothing: each round played leaves a line in the data dir, so a
test counts how often each round was played. The run's bookkeeping around it is the real one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from services.config import get_settings
from services.queue.names import TRAIN_ROUND_TASK
from services.queue.worker import create_worker_app
from trainer import loop
from trainer.runs import run_round_job


def played_rounds() -> Path:
    return get_settings().data_dir / "played-rounds"


def play_nothing(config: Any, run_id: str, round_index: int, checkpoint: loop.Checkpoint, *_: Any, **__: Any) -> tuple[Any, Any]:
    with played_rounds().open("a") as record:
        record.write(f"{round_index}\n")
    return loop.Checkpoint(checkpoint.rounds_done + 1), loop.Published()


loop.run_round = play_nothing
app = create_worker_app("trainer", {TRAIN_ROUND_TASK: run_round_job})
