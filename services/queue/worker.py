"""Builds a service's Celery worker app: its job tasks plus the probe, logging per process, the
sweeper (``services.queue.sweeper``) in the process that runs the jobs, the isolation check of workers
that run untrusted code, and the worker's metrics server (``KZ_METRICS_PORT``)."""

from __future__ import annotations

import os
from typing import Any

import structlog
from celery import Celery
from celery.concurrency.prefork import TaskPool as PreforkPool
from celery.signals import worker_init, worker_process_init, worker_process_shutdown, worker_ready

from services.config import get_settings
from services.db.session import get_engine
from services.logs import configure_logging
from services.metrics import ISOLATION, clear_multiprocess_dir, forget_process, start_worker_metrics_server
from services.queue.app import create_celery
from services.queue.jobs import JobFunction, register_job_task
from services.queue.names import probe_task_name, service_queues
from services.queue.probe import probe
from services.queue.sweeper import start_sweeper
from services.sandbox import sandbox_available

log = structlog.get_logger(__name__)


class IsolationRefused(SystemExit):
    """The worker stops before it takes a job: KZ_SANDBOX asks for isolation this host cannot give."""


def check_isolation(service: str) -> str:
    """The isolation this worker's sandboxed children will get ("bwrap" or "fallback"), or
    ``IsolationRefused`` (exit status 1, the reason on stderr) where ``KZ_SANDBOX=bwrap`` and bubblewrap
    does not work: a deployment must never score untrusted code with the weaker fallback unnoticed."""
    try:
        mode = sandbox_available()
    except (RuntimeError, ValueError) as exc:
        raise IsolationRefused(f"{service} worker refuses to start: {exc}") from exc
    ISOLATION.labels(service, mode).set(1)
    log.info("worker.isolation", mode=mode, required=os.environ.get("KZ_SANDBOX", "auto"))
    return mode


def create_worker_app(service: str, jobs: dict[str, JobFunction] | None = None, *, runs_untrusted_code: bool = False) -> Celery:
    """``runs_untrusted_code``: its jobs run code from outside (candidate kernels, proposed modules) in
    sandboxed children, so the worker checks its isolation before it starts consuming."""
    app = create_celery(f"kernelzero-{service}")
    register_job_task(app, probe_task_name(service), probe)
    for kind, work in (jobs or {}).items():
        register_job_task(app, kind, work)

    @worker_init.connect(weak=False)
    def _before_consuming(**_: object) -> None:
        # In the main process, before the pool starts: a refusal here exits with no job taken.
        clear_multiprocess_dir()
        if runs_untrusted_code:
            check_isolation(service)

    @worker_process_init.connect(weak=False)
    def _init_process(**_: object) -> None:
        configure_logging(f"{service}-worker")
        # The pool the parent may have opened (a hard time limit's failure is recorded there) is its
        # own: a forked child leaves those connections alone and opens its own (SQLAlchemy's recipe).
        get_engine().dispose(close=False)
        start_sweeper()

    @worker_process_shutdown.connect(weak=False)
    def _end_process(pid: int | None = None, **_: object) -> None:
        forget_process(pid or os.getpid())

    @worker_ready.connect(weak=False)
    def _ready(sender: Any, **_: object) -> None:
        # A prefork pool's children sweep (above): the parent stays free of threads it would fork.
        if not isinstance(sender.pool, PreforkPool):
            start_sweeper()
        # The metrics server's thread starts only now, after the pool's processes were forked.
        settings = get_settings()
        if settings.metrics_port is not None:
            consumed = list(getattr(sender.app.amqp.queues, "consume_from", None) or {})  # its -Q
            start_worker_metrics_server(settings.metrics_port, consumed or service_queues(service, settings.gpu_devices))

    configure_logging(f"{service}-worker")
    return app
