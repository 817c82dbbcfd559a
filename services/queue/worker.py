"""Builds a service's Celery worker app: its job tasks plus the probe, logging per process, and the
sweeper (``services.queue.sweeper``) in the process that runs the jobs."""

from __future__ import annotations

from typing import Any

from celery import Celery
from celery.concurrency.prefork import TaskPool as PreforkPool
from celery.signals import worker_process_init, worker_ready

from services.db.session import get_engine
from services.logs import configure_logging
from services.queue.app import create_celery
from services.queue.jobs import JobFunction, register_job_task
from services.queue.names import probe_task_name
from services.queue.probe import probe
from services.queue.sweeper import start_sweeper


def create_worker_app(service: str, jobs: dict[str, JobFunction] | None = None) -> Celery:
    app = create_celery(f"kernelzero-{service}")
    register_job_task(app, probe_task_name(service), probe)
    for kind, work in (jobs or {}).items():
        register_job_task(app, kind, work)

    @worker_process_init.connect(weak=False)
    def _init_process(**_: object) -> None:
        configure_logging(f"{service}-worker")
        # The pool the parent may have opened (a hard time limit's failure is recorded there) is its
        # own: a forked child leaves those connections alone and opens its own (SQLAlchemy's recipe).
        get_engine().dispose(close=False)
        start_sweeper()

    @worker_ready.connect(weak=False)
    def _ready(sender: Any, **_: object) -> None:
        # A prefork pool's children sweep (above): the parent stays free of threads it would fork.
        if not isinstance(sender.pool, PreforkPool):
            start_sweeper()

    configure_logging(f"{service}-worker")
    return app
