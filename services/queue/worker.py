"""Builds a service's Celery worker app: its job tasks plus the probe, logging per process."""

from __future__ import annotations

from celery import Celery
from celery.signals import worker_process_init

from services.logs import configure_logging
from services.queue.app import create_celery
from services.queue.jobs import JobFunction, register_job_task
from services.queue.names import probe_task_name
from services.queue.probe import probe


def create_worker_app(service: str, jobs: dict[str, JobFunction] | None = None) -> Celery:
    app = create_celery(f"kernelzero-{service}")
    register_job_task(app, probe_task_name(service), probe)
    for kind, work in (jobs or {}).items():
        register_job_task(app, kind, work)

    @worker_process_init.connect(weak=False)
    def _init_process(**_: object) -> None:
        configure_logging(f"{service}-worker")

    configure_logging(f"{service}-worker")
    return app
