"""The reward service's Celery worker: `celery -A reward_svc.worker worker -Q score.cpu` (or `score.gpu<i>`).

One evaluator per worker process keeps its sandboxed children warm between jobs; a GPU worker
runs with ``--pool threads`` so its concurrent jobs share that evaluator.
"""

import threading
from functools import lru_cache
from typing import Any

from reward_svc.evaluate import Evaluator
from reward_svc.service import run_score_job
from services.children.device import contexts_lost
from services.queue import unfit
from services.queue.names import SCORE_GROUP_TASK
from services.queue.worker import create_worker_app

_evaluator_lock = threading.Lock()


@lru_cache
def _evaluator() -> Evaluator:
    return Evaluator()


def evaluator() -> Evaluator:
    with _evaluator_lock:  # lru_cache alone lets two first jobs on threads build two evaluators
        return _evaluator()


def score_group_job(job_id: str, payload: dict[str, Any]) -> dict[str, Any]:
    return run_score_job(evaluator(), job_id, payload)


# A lost CUDA context can first show where no judge checks it (a group's cleanup frees cached memory): looked
# for after any failed job.
unfit.add_check(contexts_lost)
app = create_worker_app("reward", {SCORE_GROUP_TASK: score_group_job}, runs_untrusted_code=True)
