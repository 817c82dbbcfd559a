"""The proposer service's Celery worker: `celery -A proposer_svc.worker worker -Q proposal`."""

from services.queue.worker import create_worker_app
from proposer_svc.service import PROPOSE_TASK, run_propose_job

app = create_worker_app("proposer", {PROPOSE_TASK: run_propose_job})
