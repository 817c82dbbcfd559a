"""The Celery application: broker settings every workload shares, tuned for long GPU jobs."""

from __future__ import annotations

from functools import lru_cache

import redis
from celery import Celery

from services.config import Settings, get_settings


def create_celery(name: str, settings: Settings | None = None, include: list[str] | None = None) -> Celery:
    settings = settings or get_settings()
    app = Celery(name, broker=settings.redis_url, include=include or [])
    app.conf.update(
        # A job is acknowledged only after it finished, so a worker that dies mid-job loses nothing:
        # the message goes back to the queue (reject_on_worker_lost) and another worker runs it.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_soft_time_limit=settings.task_soft_time_limit_s,
        task_time_limit=settings.task_hard_time_limit_s,
        broker_transport_options={"visibility_timeout": settings.visibility_timeout_s},
        broker_connection_retry_on_startup=True,
        # Redis away: a worker keeps reconnecting (every 2, 4, ... up to 30 s) however long it takes, instead of
        # exiting after Celery's default 100 tries (about 46 minutes), which `kernelzero up` would then have to
        # restart into the same outage until its crash-loop limit stopped the whole platform.
        broker_connection_max_retries=None,
        # A job running when the connection drops finishes and stores its outcome in the database (it needs no
        # Redis); cancelling it (Celery 6's default) would throw its work away. Its message, unacknowledged, comes
        # back later and is skipped as finished.
        worker_cancel_long_running_tasks_on_connection_loss=False,
        # Results live in the jobs table; Redis holds only queues.
        task_ignore_result=True,
        task_serializer="json",
        accept_content=["json"],
        worker_hijack_root_logger=False,
        # Job logs are JSON lines on stderr; Celery's redirect would re-wrap each as a WARNING.
        worker_redirect_stdouts=False,
        worker_send_task_events=False,
        task_default_queue="default",
    )
    return app


@lru_cache
def producer() -> Celery:
    """The app that HTTP services use to send jobs by name to any queue."""
    return create_celery("kernelzero-producer")


REDIS_TIMEOUT_S = 5.0


def redis_client(url: str | None = None) -> redis.Redis:
    """A client of the platform's Redis (``url``: the settings' by default) that gives up on one that does not
    answer, a host gone or a network cut rather than a refused connection, within ``REDIS_TIMEOUT_S`` for the
    connection and for each reply. Stated, not left to redis-py: its default is no timeout at all in the
    5.x releases pyproject.toml allows (8.x waits 5 s), and no timeout would hang an API request, or the
    sweeper's thread and with it every recovery, until TCP itself gave up (many minutes)."""
    return redis.Redis.from_url(
        url or get_settings().redis_url, socket_connect_timeout=REDIS_TIMEOUT_S, socket_timeout=REDIS_TIMEOUT_S
    )
