"""The reward service's Celery worker: `celery -A reward_svc.worker worker`."""

from services.queue.worker import create_worker_app

app = create_worker_app("reward")
