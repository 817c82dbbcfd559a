"""The proposer service's Celery worker: `celery -A proposer_svc.worker worker -Q proposal`."""

from proposer_svc.service import run_propose_job
from services.queue.names import PROPOSE_TASK
from services.queue.worker import create_worker_app

app = create_worker_app("proposer", {PROPOSE_TASK: run_propose_job}, runs_untrusted_code=True)
