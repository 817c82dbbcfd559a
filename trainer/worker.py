"""The trainer service's Celery worker: `celery -A trainer.worker worker -Q training`."""

from services.queue.names import TRAIN_ROUND_TASK
from services.queue.worker import create_worker_app
from trainer.runs import run_round_job

app = create_worker_app("trainer", {TRAIN_ROUND_TASK: run_round_job})
