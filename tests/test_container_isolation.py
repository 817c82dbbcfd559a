"""The CPU image as compose runs it, under a real Docker engine: the sandboxing worker's container
settings (``docker-compose.yml``: no capability, read-only root, uid 10001, the seccomp profile that
lets bubblewrap make its namespaces) give bubblewrap isolation, a candidate is scored under it, its
child has no network, and the same worker under Docker's default profile refuses to start.

Needs a Docker engine and a built image named by ``KZ_TEST_IMAGE``:

    docker build -f docker/Dockerfile -t kernelzero:0.1.0 .
    KZ_TEST_IMAGE=kernelzero:0.1.0 .venv/bin/python -m pytest -m container tests/test_container_isolation.py

Skipped otherwise (CI has no engine): ``benchmarks/results/deploy/`` records the runs.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator

import pytest

from compose_project import IMAGE, ROOT, ComposeProject, needs_engine_and_image

pytestmark = [pytest.mark.container, needs_engine_and_image]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ComposeProject]:
    compose = ComposeProject(tmp_path_factory.mktemp("compose"))
    yield compose
    compose.down()


def test_the_worker_container_runs_unprivileged_on_a_read_only_root(project: ComposeProject) -> None:
    out = project.run(
        "reward-worker", "sh", "-c", "id -u; grep CapEff /proc/self/status; touch /opt/venv/x 2>&1; echo $KZ_SANDBOX"
    )
    uid, caps, touched, sandbox = out.strip().splitlines()[-4:]
    assert uid == "10001"
    assert caps.split() == ["CapEff:", "0000000000000000"]
    assert "Read-only file system" in touched
    assert sandbox == "bwrap"


def test_a_candidate_is_scored_under_bubblewrap_in_the_worker_container(project: ComposeProject) -> None:
    out = project.run(
        "reward-worker",
        "kernelzero",
        "score",
        "--reference",
        "/kernels/relu/reference.py",
        "--candidate",
        "/kernels/relu/triton_correct.py",
        "--backend",
        "triton",
        "--json",
        volumes=(f"{ROOT / 'tests' / 'kernels'}:/kernels:ro",),
    )
    verdict = json.loads(out[out.index("{") :])
    assert verdict["status"] == "correct", verdict["reason"]
    assert verdict["details"]["isolation"] == "bwrap"


OBSERVE = """
import json, socket
def observe(gateway):
    try:
        socket.create_connection((gateway, 6379), timeout=3).close()
        reached = "connected"
    except OSError as exc:
        reached = type(exc).__name__ + ": " + str(exc)
    return {"interfaces": sorted(name for _, name in socket.if_nameindex()), "gateway": reached}
"""

IN_CONTAINER = """
import json, socket, struct, sys
from services.sandbox import Confinement, run_sandboxed
exec(sys.argv[1])
routes = [line.split() for line in open("/proc/net/route").read().splitlines()[1:]]
gateway = socket.inet_ntoa(struct.pack("<L", int(next(r for r in routes if r[1] == "00000000")[2], 16)))
child = run_sandboxed([sys.executable, "-c", sys.argv[1] + f"\\nprint(json.dumps(observe({gateway!r})))"], Confinement(wall_timeout_s=30))
assert child.returncode == 0, child.stderr.decode()
print(json.dumps({"container": observe(gateway), "child": json.loads(child.stdout), "isolation": child.isolation}))
"""


def test_a_sandboxed_child_in_the_worker_container_has_no_network(project: ComposeProject) -> None:
    """The container itself is on compose's network (it reaches its gateway: refused, or answered); the
    bubblewrap child inside it has a loopback only, and no route anywhere."""
    out = project.run("reward-worker", "python", "-c", IN_CONTAINER, OBSERVE)
    seen = json.loads(out.strip().splitlines()[-1])
    assert seen["isolation"] == "bwrap"
    assert seen["container"]["interfaces"] != ["lo"] and "unreachable" not in seen["container"]["gateway"]
    assert seen["child"]["interfaces"] == ["lo"]
    assert "Network is unreachable" in seen["child"]["gateway"]


def test_the_worker_reports_bubblewrap_when_it_starts(project: ComposeProject) -> None:
    """The worker's own start (compose's command), as a deployment sees it in its logs."""
    started = project("run", "--detach", "--no-deps", "--pull", "never", "reward-worker").stdout.strip().splitlines()[-1]
    try:
        deadline, logs = time.monotonic() + 120, ""
        while time.monotonic() < deadline and '"worker.isolation"' not in logs:
            time.sleep(1)
            done = subprocess.run(["docker", "logs", started], capture_output=True, text=True)
            logs = done.stdout + done.stderr
        event = next(json.loads(line) for line in logs.splitlines() if '"worker.isolation"' in line)
        assert event["mode"] == "bwrap" and event["required"] == "bwrap"
    finally:
        subprocess.run(["docker", "rm", "--force", started], capture_output=True)


def test_the_worker_refuses_to_start_under_dockers_default_profile(project: ComposeProject) -> None:
    """Without the shipped profile (Docker's default seccomp refuses the namespace calls) the same worker
    command exits at once with the reason, having taken no job."""
    command = json.loads(project("config", "--format", "json").stdout)["services"]["reward-worker"]["command"]
    done = subprocess.run(
        ["docker", "run", "--rm", "--cap-drop", "ALL", "--security-opt", "no-new-privileges:true", "--read-only"]
        + ["--tmpfs", "/tmp", "-e", "KZ_SANDBOX=bwrap", IMAGE, *command],
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 1, output[-3000:]
    assert "reward worker refuses to start: KZ_SANDBOX=bwrap but bubblewrap does not work here" in output
    assert " ready." not in output
