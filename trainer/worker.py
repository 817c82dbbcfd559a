"""The trainer service's Celery worker: `celery -A trainer.worker worker`."""

from services.queue.worker import create_worker_app

app = create_worker_app("trainer")
