"""The coder service's Celery worker: `celery -A coder_svc.worker worker`."""

from services.queue.worker import create_worker_app

app = create_worker_app("coder")
