"""The proposer service's Celery worker: `celery -A proposer_svc.worker worker`."""

from services.queue.worker import create_worker_app

app = create_worker_app("proposer")
