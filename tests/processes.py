"""Processes of the platform started for a test or a benchmark: a Celery worker built as ``kernelzero up``
builds it (``launch_worker``), which processes a test left running (``leftovers``); and this process's
cached view of the platform (``reset_platform_caches``), to be dropped when the environment changes."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from services.cli.launcher import platform_commands
from services.config import get_settings
from services.db.session import engine_for
from services.queue.app import producer

TESTS_DIR = Path(__file__).resolve().parent


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Until ``condition()`` holds; TimeoutError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not {what} after {timeout_s} s")
        time.sleep(0.05)


def reset_platform_caches() -> None:
    """Forget cached settings, engines and the producer so the next call reads the environment."""
    if producer.cache_info().currsize:
        producer().close()
    producer.cache_clear()
    engine_for.cache_clear()
    get_settings.cache_clear()


class WorkerDidNotStart(RuntimeError):
    pass


@dataclass
class WorkerProcess:
    """A Celery worker: its main process and the log it writes."""

    popen: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_once_it_has(self, text: str, timeout_s: float = 10) -> str:
        """The log once ``text`` is in it: a job's row changes before its worker logs the change."""
        wait_for(lambda: text in self.log(), timeout_s, f"{text!r} in {self.log_path.name}")
        return self.log()

    def pool_pids(self) -> set[int]:
        return {child.pid for child in psutil.Process(self.popen.pid).children(recursive=True)}

    def stop(self) -> None:
        """SIGTERM the worker's process group, SIGKILL what is left after a grace period."""
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.popen.wait()


def launch_worker(
    service: str, log_path: Path, app: str | None = None, ready_timeout_s: float = 60, **fields: object
) -> WorkerProcess:
    """``<service>.worker`` started as ``kernelzero up`` starts it, in a process group of its own, once it
    says it is ready. ``app`` swaps the worker module for one under tests/ (``worker_apps``,
    ``fault_apps.reward``); extra KZ_ fields go to its environment."""
    env = dict(os.environ) | {f"KZ_{k.upper()}": str(v) for k, v in fields.items()}
    command = next(p.command for p in platform_commands(get_settings(), (service,)) if p.name.endswith("worker"))
    if app is not None:
        command[command.index("-A") + 1] = app
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS_DIR), env.get("PYTHONPATH")]))
    with log_path.open("wb") as log:
        popen = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    worker = WorkerProcess(popen, log_path)
    deadline = time.monotonic() + ready_timeout_s
    while " ready." not in worker.log():
        if popen.poll() is not None or time.monotonic() > deadline:
            worker.stop()
            raise WorkerDidNotStart(f"{service} worker did not start (exit {popen.poll()}):\n{worker.log()[-3000:]}")
        time.sleep(0.1)
    return worker


def leftovers(data_dir: Path, pids: set[int]) -> list[str]:
    """Live processes that were started for this platform: by pid, or naming its data dir."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        if proc.pid == os.getpid() or proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            environ = proc.environ()
        except (psutil.AccessDenied, psutil.NoSuchProcess):
            environ = {}
        cmdline = " ".join(proc.info["cmdline"] or [])
        if proc.pid in pids or environ.get("KZ_DATA_DIR") == str(data_dir) or str(data_dir) in cmdline:
            found.append(f"{proc.pid} {cmdline}")
    return found
