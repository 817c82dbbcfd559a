"""Prometheus metrics of the platform: what the APIs' /metrics and each worker's metrics server export.

Every metric is named ``kernelzero_*``. The APIs serve them on their own port (``/metrics``, next to the
HTTP metrics of prometheus-fastapi-instrumentator); a worker serves them on ``KZ_METRICS_PORT`` when that
is set (deployments set it; ``kernelzero up`` leaves it unset, so local workers open no port).

A prefork worker runs its jobs in pool processes: with ``PROMETHEUS_MULTIPROC_DIR`` set (deployments set
it to an empty, writable directory) prometheus-client writes each process's samples there and the worker's
server adds them up. Without it the server exports its own process's samples, which is exact for the
threads pool (the GPU reward worker) and ``--pool solo``.

Queue depth and GPU utilisation are read when scraped (``QueueDepthCollector``, ``GpuCollector``), so
they cost nothing between scrapes and are never stale.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import redis
import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import REGISTRY, Collector

log = structlog.get_logger(__name__)

# Jobs run from milliseconds (a probe) to the hard time limit (a GPU group, a training round).
JOB_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 2400, float("inf"))

JOBS = Counter(
    "kernelzero_jobs_total",
    "Job attempts a worker finished, by outcome: succeeded, failed, or skipped (finished already, running elsewhere).",
    ["service", "kind", "outcome"],
)
JOB_SECONDS = Histogram(
    "kernelzero_job_duration_seconds", "Wall time of a job attempt a worker ran.", ["service", "kind"], buckets=JOB_BUCKETS
)
VERDICTS = Counter(
    "kernelzero_verdicts_total",
    "Candidate verdicts the reward service reached, by status and by the guard that decided ('none': no guard).",
    ["status", "guard"],
)
SANDBOX_RUNS = Counter(
    "kernelzero_sandbox_runs_total",
    "Sandboxed children that ended, by isolation and ending: ok, exit_error, timed_out, out_of_memory, signal. "
    "Endings other than ok and exit_error are sandbox failures.",
    ["isolation", "ending"],
)
# Set once per worker at start; "max" keeps the value of the process that set it in multiprocess mode.
ISOLATION = Gauge(
    "kernelzero_sandbox_isolation",
    "1 for the isolation this worker's sandboxed children get: bwrap, or the weaker fallback.",
    ["service", "mode"],
    multiprocess_mode="max",
)
MODEL_VERSION = Gauge(
    "kernelzero_model_version_served",
    "Number N of the {role}-vN version a worker serves (0: the base model or the template).",
    ["role", "backend"],
    multiprocess_mode="mostrecent",
)
TRAINER_STEPS = Counter("kernelzero_trainer_steps_total", "Optimizer steps the trainer recorded.", ["role"])
TRAINER_STEP_VALUE = Gauge(
    "kernelzero_trainer_step_value",
    "The last optimizer step's metrics (loss, reward_mean, reward_std, ...), by role and name.",
    ["role", "name"],
    multiprocess_mode="mostrecent",
)

VERSION_NUMBER = re.compile(r"-v(\d+)$")
# Celery's Redis transport keeps a queue's messages of priority p > 0 under "<queue>\x06\x16<p>".
PRIORITY_SUFFIXES = ("", "\x06\x163", "\x06\x166", "\x06\x169")


def record_sandbox_ending(isolation: str, *, timed_out: bool, signal: int | None, returncode: int | None, oom: bool) -> None:
    if timed_out:
        ending = "timed_out"
    elif oom:
        ending = "out_of_memory"
    elif signal is not None:
        ending = "signal"
    else:
        ending = "ok" if returncode == 0 else "exit_error"
    SANDBOX_RUNS.labels(isolation, ending).inc()


def record_served_version(role: str, backend: str, version_name: str | None) -> None:
    match = VERSION_NUMBER.search(version_name or "")
    MODEL_VERSION.labels(role, backend).set(int(match[1]) if match else 0)


def record_trainer_step(role: str, metrics: dict[str, Any]) -> None:
    TRAINER_STEPS.labels(role).inc()
    for name, value in metrics.items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            TRAINER_STEP_VALUE.labels(role, name).set(value)


class QueueDepthCollector(Collector):
    """``kernelzero_queue_depth{queue}``: messages waiting in each Redis queue, read at scrape time."""

    def __init__(self, queues: Iterable[str]) -> None:
        self.queues = set(queues)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from services.config import get_settings

        family = GaugeMetricFamily("kernelzero_queue_depth", "Messages waiting in a Redis queue.", labels=["queue"])
        up = GaugeMetricFamily("kernelzero_broker_up", "1 when the last scrape could read the queues from Redis.")
        try:
            client = redis.Redis.from_url(get_settings().redis_url, socket_connect_timeout=2, socket_timeout=2)
            with client.pipeline(transaction=False) as pipe:
                for queue in sorted(self.queues):
                    for suffix in PRIORITY_SUFFIXES:
                        pipe.llen(queue + suffix)
                lengths = pipe.execute()
        except redis.RedisError as exc:
            log.warning("metrics.queue_depth_unreadable", error=str(exc))
            up.add_metric([], 0)
        else:
            per_queue = len(PRIORITY_SUFFIXES)
            for index, queue in enumerate(sorted(self.queues)):
                family.add_metric([queue], sum(lengths[index * per_queue : (index + 1) * per_queue]))
            up.add_metric([], 1)
        yield family
        yield up


class GpuCollector(Collector):
    """``kernelzero_gpu_utilization_ratio`` and memory of the GPUs this process sees, through NVML
    (nvidia-ml-py); nothing at all where there is no NVML (a CPU host), so no series exist there."""

    def __init__(self) -> None:
        self._nvml: Any = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
        except Exception:  # no library, no driver, no device: a CPU host
            self._nvml = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        if self._nvml is None:
            return
        nvml = self._nvml
        utilization = GaugeMetricFamily("kernelzero_gpu_utilization_ratio", "GPU busy share (NVML).", labels=["gpu"])
        used = GaugeMetricFamily("kernelzero_gpu_memory_used_bytes", "GPU memory in use.", labels=["gpu"])
        total = GaugeMetricFamily("kernelzero_gpu_memory_total_bytes", "GPU memory.", labels=["gpu"])
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            rates = nvml.nvmlDeviceGetUtilizationRates(handle)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            utilization.add_metric([str(index)], rates.gpu / 100)
            used.add_metric([str(index)], memory.used)
            total.add_metric([str(index)], memory.total)
        yield from (utilization, used, total)


_api_queues = QueueDepthCollector(())
_api_lock = threading.Lock()


def export_queue_depth_from_api(queues: Iterable[str]) -> None:
    """Add ``queues`` to what the APIs' /metrics (the default registry) reports the depth of."""
    with _api_lock:
        if not _api_queues.queues:
            REGISTRY.register(_api_queues)
        _api_queues.queues.update(queues)


def start_worker_metrics_server(port: int, queues: Iterable[str], addr: str = "0.0.0.0") -> None:
    """Serve /metrics for a worker: its jobs' metrics (all pool processes' in multiprocess mode), the
    depth of its queues and, where NVML works, its GPUs."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        MultiProcessCollector(registry)
    else:
        registry = REGISTRY
    registry.register(QueueDepthCollector(queues))
    registry.register(GpuCollector())
    start_http_server(port, addr=addr, registry=registry)
    log.info("metrics.serving", port=port, multiprocess=registry is not REGISTRY)


def clear_multiprocess_dir() -> None:
    """A restarted worker's container keeps its volume (an emptyDir outlives a container restart): samples
    the dead processes left there would add to the new ones'. Called by the worker's main process before
    any of its processes records a sample."""
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if directory:
        for stale in Path(directory).glob("*.db"):
            stale.unlink(missing_ok=True)


def forget_process(pid: int) -> None:
    """A pool process ended: drop its live gauges' files (multiprocess mode only)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        mark_process_dead(pid)
