"""``kernelzero up`` keeps the platform up: a worker or API process that dies is started again (after a
backoff, each restart logged), one that keeps dying is a crash loop that stops the platform with the
reason; a second ``up`` on the same data dir is refused at once and leaves the first alone; a port held by
something else is refused before anything starts; and an ``up`` started with SIGINT ignored (a script's
``&``) still stops on SIGINT.

The platform test runs the real thing (eight processes and Redis); the supervision tests run the launcher's
loop over tiny processes, so a crash loop takes a second, not minutes.
"""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil
import pytest
from rich.console import Console

from processes import leftovers
from servers import KERNELZERO, interrupt_up, start_up, wait_until_up
from services.cli.launcher import CrashLoop, Launcher, ManagedProcess, instance_lock_path, run_state_path
from services.clients import RewardClient
from services.config import SERVICE_NAMES, Settings


def pids(settings: Settings) -> dict[str, int]:
    return {p["name"]: p["pid"] for p in json.loads(run_state_path(settings).read_text())["processes"]}


def until(predicate: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Poll ``predicate`` until it holds; the seconds it took."""
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < timeout_s, f"{what} within {timeout_s} s"
        time.sleep(0.05)
    return time.monotonic() - start


def gone(process: psutil.Process) -> bool:
    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.slow
def test_up_restarts_a_killed_worker_and_api_refuses_a_second_up_and_stops_on_sigint(
    platform_env: Callable[..., Settings], free_port: Callable[[], int], tmp_path: Path
) -> None:
    settings = platform_env(auth_enabled=True, **{f"{service}_port": free_port() for service in SERVICE_NAMES})
    log = tmp_path / "up.log"
    launcher = start_up(log, sigint_ignored=True)
    try:
        wait_until_up(launcher, log, settings)
        state = run_state_path(settings).read_text()
        first = pids(settings)

        # A second `up` on this data dir: refused in one line naming the first, which is left as it was.
        second = subprocess.run([str(KERNELZERO), "up"], capture_output=True, text=True, timeout=60, env=dict(os.environ))
        assert second.returncode == 1, second.stdout + second.stderr
        [line] = [line for line in second.stdout.splitlines() if line.strip()]
        assert f"kernelzero up already runs on {settings.data_dir} as pid {launcher.pid}" in line, line
        assert run_state_path(settings).read_text() == state
        assert all(psutil.pid_exists(pid) for pid in first.values())
        assert ready(settings.service_url("reward"))

        # SIGKILL the reward worker's main process: its pool child goes with it, and it comes back.
        worker = psutil.Process(first["reward-worker"])
        pool = worker.children(recursive=True)
        worker.kill()
        killed = time.monotonic()
        until(lambda: pids(settings)["reward-worker"] != first["reward-worker"], 30, "the reward worker restarted")
        restarted_s = time.monotonic() - killed
        assert pool and all(gone(child) for child in pool)
        with RewardClient() as reward:
            job = reward.probe(token="after-the-kill")  # submitted before the new worker is ready: it waits queued
            done = reward.wait_for_job(job.id, timeout_s=120, poll_s=0.1)
        serving_s = time.monotonic() - killed
        assert done.status == "succeeded", done.error
        new_worker = pids(settings)["reward-worker"]
        assert done.result is not None and done.result["pid"] in {new_worker} | {
            child.pid for child in psutil.Process(new_worker).children(recursive=True)
        }

        # SIGKILL the reward API (uvicorn): it comes back on its port.
        os.kill(first["reward-api"], signal.SIGKILL)
        killed = time.monotonic()
        until(lambda: pids(settings)["reward-api"] != first["reward-api"], 30, "the reward API restarted")
        until(lambda: ready(settings.service_url("reward")), 60, "the reward API ready again")
        api_s = time.monotonic() - killed
        text = log.read_text()
        for name, pid in (("reward-worker", first["reward-worker"]), ("reward-api", first["reward-api"])):
            assert f"{name} (pid {pid}) died: killed by SIGKILL; restarting it in 1 s" in text, text[-3000:]
            assert f"{name} restarted: pid {pid} -> " in text
        untouched = {name: pid for name, pid in first.items() if not name.startswith("reward-")}
        assert {name: pids(settings)[name] for name in untouched} == untouched
        print(
            f"\nrestart after SIGKILL: worker spawned {restarted_s:.1f} s, a job done {serving_s:.1f} s; API ready {api_s:.1f} s"
        )
    finally:
        code = interrupt_up(launcher)  # started with SIGINT ignored, as a script's & does
    assert code == 0, log.read_text()[-4000:]
    assert not run_state_path(settings).exists()
    time.sleep(0.5)
    assert leftovers(settings.data_dir, set()) == []


def test_up_refuses_a_port_in_use_naming_it_and_its_setting(
    platform_env: Callable[..., Settings], free_port: Callable[[], int]
) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        ports = {f"{service}_port": free_port() for service in SERVICE_NAMES} | {"reward_port": port}
        settings = platform_env(auth_enabled=True, **ports)
        up = subprocess.run([str(KERNELZERO), "up"], capture_output=True, text=True, timeout=60, env=dict(os.environ))
    assert up.returncode == 1, up.stdout + up.stderr
    [line] = [line for line in up.stdout.splitlines() if line.strip()]
    assert f"port {port} on 127.0.0.1, where the reward service listens, is in use by pid {os.getpid()}" in line, line
    assert "set KZ_REWARD_PORT to a free port" in line
    assert not run_state_path(settings).exists() and not settings.api_key_file.exists()
    assert instance_lock_path(settings).exists()  # and free again: the next `up` takes it


def supervising(settings: Settings, *commands: list[str]) -> tuple[Launcher, io.StringIO, threading.Thread, list[BaseException]]:
    """A launcher supervising ``commands`` in a thread; the error its loop ended with lands in the list."""
    output = io.StringIO()
    launcher = Launcher(settings, Console(file=output, width=300), services=())
    launcher.start(env=dict(os.environ))
    for index, command in enumerate(commands):
        launcher.spawn(ManagedProcess(f"test-{index}", command))
    errors: list[BaseException] = []

    def loop() -> None:
        try:
            launcher.supervise(tick_s=0.02)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return launcher, output, thread, errors


def test_a_process_that_keeps_dying_is_a_crash_loop_with_the_reason_and_growing_backoff(
    platform_env: Callable[..., Settings],
) -> None:
    settings = platform_env(restart_limit=3, restart_window_s=60, restart_backoff_s=0.05)
    launcher, output, thread, errors = supervising(settings, [sys.executable, "-c", "import sys; sys.exit(3)"])
    thread.join(20)
    launcher.stop()
    assert [type(e) for e in errors] == [CrashLoop]
    assert str(errors[0]) == (
        "test-0 crash loop: it died again (exit code 3) after 3 restart(s) within 60 s "
        "(KZ_RESTART_LIMIT=3, KZ_RESTART_WINDOW_S=60); its last lines are above"
    )
    delays = [
        line.split("restarting it in ")[1].split(" s ")[0] for line in output.getvalue().splitlines() if "restarting" in line
    ]
    assert delays == ["0.05", "0.1", "0.2"]


def test_a_restart_limit_of_zero_stops_at_the_first_death(platform_env: Callable[..., Settings]) -> None:
    launcher, output, thread, errors = supervising(platform_env(restart_limit=0), [sys.executable, "-c", "import os; os.abort()"])
    thread.join(20)
    launcher.stop()
    assert [str(e) for e in errors] == ["test-0 died (killed by SIGABRT), and KZ_RESTART_LIMIT=0 turns restarts off"]
    assert "restarting" not in output.getvalue()


def test_a_dead_process_is_restarted_and_what_it_forked_goes_with_it(platform_env: Callable[..., Settings]) -> None:
    settings = platform_env(restart_backoff_s=0)
    forks = (
        "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
    )
    launcher, output, thread, errors = supervising(settings, [sys.executable, "-c", forks])
    try:
        [process] = launcher.processes
        leader = psutil.Process(process.pid)
        until(lambda: len(leader.children()) == 1, 20, "the child forked")
        [forked] = leader.children()
        leader.kill()
        until(lambda: process.pid != leader.pid, 5, "a restart")
        until(lambda: gone(forked), 5, "the forked child killed")
        until(lambda: pids(settings) == {"test-0": process.pid}, 5, "the state file updated")  # written just after the start
        assert psutil.pid_exists(process.pid)
        assert f"test-0 (pid {leader.pid}) died: killed by SIGKILL; restarting it in 0 s" in output.getvalue()
    finally:
        launcher.request_stop()
        thread.join(5)
        launcher.stop()
    assert errors == [] and not run_state_path(settings).exists()
