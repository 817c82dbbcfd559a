"""``kernelzero up`` runs the whole platform and Ctrl-C leaves nothing behind.

The installed ``kernelzero`` starts the four services and their workers on free ports with a
private data dir; the typed clients then check each service end to end (health, readiness, a probe
job through its worker, errors carrying the server's reason), ``kernelzero status`` reports it,
and ``kernelzero down`` (SIGINT, as Ctrl-C) must stop every process the launcher started.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from processes import leftovers
from servers import CLIENTS, KERNELZERO, interrupt_up, start_up, wait_until_up
from services.cli.launcher import run_state_path
from services.clients import ServiceError, TrainerClient
from services.config import SERVICE_NAMES, Settings


def test_kernelzero_up_serves_all_four_then_stops_clean(
    platform_env: Callable[..., Settings], free_port: Callable[[], int], tmp_path: Path
) -> None:
    settings = platform_env(
        auth_enabled=True,
        database_url=f"sqlite:///{tmp_path / 'up.db'}",  # unmigrated: `up` must migrate it
        **{f"{service}_port": free_port() for service in SERVICE_NAMES},
    )
    log = tmp_path / "up.log"
    launcher = start_up(log)
    try:
        wait_until_up(launcher, log, settings)
        state = json.loads(run_state_path(settings).read_text())
        assert state["launcher_pid"] == launcher.pid
        assert {p["name"] for p in state["processes"]} == {f"{s}-{r}" for s in SERVICE_NAMES for r in ("api", "worker")}
        started = {p["pid"] for p in state["processes"]} | {launcher.pid}
        descendants = {p.pid for p in psutil.Process(launcher.pid).children(recursive=True)}
        assert started - {launcher.pid} <= descendants

        clients = {service: CLIENTS[service]() for service in SERVICE_NAMES}
        jobs = {}
        for service, client in clients.items():
            assert client.base_url == f"http://127.0.0.1:{settings.service_port(service)}"
            assert client.health() == {"status": "ok", "service": service}
            assert client.readiness().checks == {"database": "ok", "redis": "ok"}
            jobs[service] = client.probe(token=f"up-{service}")
            assert client.probe(token=f"up-{service}").id == jobs[service].id
        for service, client in clients.items():
            done = client.wait_for_job(jobs[service].id, timeout_s=60, poll_s=0.2)
            assert done.status == "succeeded", done.error
            assert done.result is not None and done.result["pid"] in descendants
            client.close()

        with TrainerClient() as client, pytest.raises(ServiceError) as not_found:
            client.get_job("no-such-job")
        assert (not_found.value.status_code, not_found.value.detail) == (404, "no job with id no-such-job")
        with TrainerClient(api_key="kz_wrong") as client, pytest.raises(ServiceError) as refused:
            client.get_job(jobs["trainer"].id)
        assert (refused.value.status_code, refused.value.detail) == (401, "invalid or revoked API key")

        status = subprocess.run(
            [str(KERNELZERO), "status", "--json"], capture_output=True, text=True, timeout=60, env=dict(os.environ)
        )
        assert status.returncode == 0, status.stderr
        report = json.loads(status.stdout)
        assert report["services"] == {s: "ready" for s in SERVICE_NAMES}
        assert all(p["alive"] for p in report["processes"]) and len(report["processes"]) == 8
        assert set(report["queues"].values()) == {0}
        assert report["ready"] is True
        running = leftovers(settings.data_dir, set())  # the detector sees the live platform
        assert len(running) >= 1 + 8, running

        down = subprocess.run([str(KERNELZERO), "down"], capture_output=True, text=True, timeout=90, env=dict(os.environ))
        assert down.returncode == 0 and f"stopped kernelzero up (pid {launcher.pid})" in down.stdout, down.stdout + down.stderr
        code = launcher.wait(timeout=10)  # `down` returns once up let its lock go: it has exited
    finally:
        if launcher.poll() is None:
            code = interrupt_up(launcher)
    assert code == 0, log.read_text()[-4000:]
    assert not run_state_path(settings).exists()
    assert leftovers(settings.data_dir, started | descendants) == []
