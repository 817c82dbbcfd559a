"""The reward service's Celery worker: `celery -A reward_svc.worker worker -Q compile,score.cpu`.

One evaluator per worker process keeps its sandboxed children warm between jobs.
"""

from functools import lru_cache
from typing import Any

from services.queue.worker import create_worker_app
from reward_svc.evaluate import Evaluator
from reward_svc.service import SCORE_GROUP_TASK, run_score_job


@lru_cache
def evaluator() -> Evaluator:
    return Evaluator()


def score_group_job(job_id: str, payload: dict[str, Any]) -> dict[str, Any]:
    return run_score_job(evaluator(), job_id, payload)


app = create_worker_app("reward", {SCORE_GROUP_TASK: score_group_job})
