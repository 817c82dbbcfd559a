"""The coder service's Celery worker: `celery -A coder_svc.worker worker -Q generation`.

One generator cache per worker process keeps a loaded model between jobs.
"""

from functools import lru_cache
from typing import Any

from coder_svc.service import GeneratorCache, run_generate_job
from services.queue.names import GENERATE_TASK
from services.queue.worker import create_worker_app


@lru_cache
def generators() -> GeneratorCache:
    return GeneratorCache()


def generate_job(job_id: str, payload: dict[str, Any]) -> dict[str, Any]:
    return run_generate_job(generators(), job_id, payload)


app = create_worker_app("coder", {GENERATE_TASK: generate_job}, runs_untrusted_code=True)  # the tracer runs proposed modules
