"""The sandbox runner, with real processes in both isolation modes this machine has.

Each isolation property is checked from inside a real child: the parent only looks at what the
child printed and at the host afterwards (files, processes).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import psutil
import pytest

from services.sandbox import Confinement, SandboxProcess, SandboxResult, run_sandboxed, sandbox_available
from services.sandbox.bwrap import bwrap_argv, bwrap_probe
from services.sandbox.fallback import fallback_prefix

REPO = Path(__file__).resolve().parents[1]
HAS_BWRAP = bwrap_probe()[0] is not None
# The fallback isolates network and PIDs only where it may use unshare (root).
FALLBACK_NAMESPACES = bool(fallback_prefix(network=False))

MODES = [
    pytest.param("bwrap", marks=pytest.mark.skipif(not HAS_BWRAP, reason=f"bwrap unusable: {bwrap_probe()[1]}")),
    "fallback",
]


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("KZ_SANDBOX", request.param)
    return str(request.param)


def py(code: str, *args: str) -> list[str]:
    """argv running ``code`` with the test's own interpreter (the venv python)."""
    return [sys.executable, "-c", textwrap.dedent(code), *args]


def run_json(code: str, policy: Confinement, *args: str) -> tuple[SandboxResult, object]:
    result = run_sandboxed(py(code, *args), policy)
    assert result.returncode == 0, result.stderr.decode()
    return result, json.loads(result.stdout)


def test_normal_run_returns_stdout_stdin_and_exit_0(mode: str) -> None:
    result = run_sandboxed(py("import sys; print('got', sys.stdin.read())"), Confinement(wall_timeout_s=20), stdin=b"job")
    assert (result.returncode, result.signal, result.timed_out) == (0, None, False)
    assert result.stdout == b"got job\n"
    assert result.isolation == mode
    assert result.describe() == "exited 0"


def test_exit_code_and_stderr(mode: str) -> None:
    result = run_sandboxed(py("import sys; sys.stderr.write('bad'); sys.exit(3)"), Confinement(wall_timeout_s=20))
    assert (result.returncode, result.signal, result.stderr) == (3, None, b"bad")
    assert result.describe() == "exited 3"


def test_python_stdlib_and_venv_packages_import(mode: str) -> None:
    code = "import json, sqlite3, ssl, ctypes, psutil, services.sandbox; print('ok')"
    result = run_sandboxed(py(code), Confinement(wall_timeout_s=20, env={"PYTHONPATH": str(REPO)}))
    assert result.stdout == b"ok\n", result.stderr.decode()


def test_rlimits_are_applied(mode: str) -> None:
    policy = Confinement(wall_timeout_s=20, memory_bytes=2 << 30, cpu_seconds=7, max_file_bytes=1 << 20, max_open_files=99)
    code = """
        import json, resource as r
        print(json.dumps([r.getrlimit(x) for x in (r.RLIMIT_AS, r.RLIMIT_CPU, r.RLIMIT_FSIZE, r.RLIMIT_NOFILE, r.RLIMIT_CORE)]))
    """
    _, limits = run_json(code, policy)
    assert limits == [[2 << 30] * 2, [7, 7], [1 << 20] * 2, [99, 99], [0, 0]]


@pytest.mark.skipif(not HAS_BWRAP, reason="read-only root needs bwrap")
def test_bwrap_root_is_read_only_and_writable_dirs_and_private_tmp_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KZ_SANDBOX", "bwrap")
    work = tmp_path / "work"
    work.mkdir()
    # Next to the writable dir is still under /tmp: private, so it works but stays inside.
    private = [f"/tmp/kz-sandbox-test-{uuid.uuid4().hex}", str(tmp_path / "next-to-work")]
    forbidden = ["/usr/kz-sandbox-test"]
    # The checkout is read-only, unless it lies under /tmp (a clone there): then it is private like the rest.
    (private if REPO.resolve().is_relative_to("/tmp") else forbidden).append(str(REPO / "kz-sandbox-test"))
    code = """
        import json, sys
        def attempt(path):
            try:
                with open(path, "w") as f:
                    f.write("x")
                return "wrote"
            except OSError as exc:
                return type(exc).__name__
        print(json.dumps({p: attempt(p) for p in sys.argv[1:]}))
    """
    try:
        policy = Confinement(wall_timeout_s=20, writable_dirs=(work,))
        _, outcome = run_json(code, policy, str(work / "ok"), *private, *forbidden)
        assert outcome == {str(work / "ok"): "wrote", **{p: "wrote" for p in private}, **{p: "OSError" for p in forbidden}}
        assert (work / "ok").read_text() == "x"
        assert not any(Path(p).exists() for p in private + forbidden)
    finally:
        for p in private + forbidden:
            Path(p).unlink(missing_ok=True)


@pytest.mark.skipif(not HAS_BWRAP, reason="capabilities are dropped by bwrap")
def test_bwrap_child_has_no_capabilities(monkeypatch: pytest.MonkeyPatch) -> None:
    # bwrap started by root keeps every capability unless told otherwise: the child could
    # remount / read-write. It must have none, and no way to gain them by exec.
    monkeypatch.setenv("KZ_SANDBOX", "bwrap")
    code = """
        import json
        status = dict(line.split(":", 1) for line in open("/proc/self/status"))
        print(json.dumps({k: status[k].strip() for k in ("CapEff", "CapPrm", "NoNewPrivs")}))
    """
    _, caps = run_json(code, Confinement(wall_timeout_s=20))
    assert caps == {"CapEff": "0" * 16, "CapPrm": "0" * 16, "NoNewPrivs": "1"}


@pytest.mark.skipif(not HAS_BWRAP, reason="hidden dirs need bwrap")
def test_bwrap_hides_secrets_home_and_run_but_binds_writable_dir_inside_hidden(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KZ_SANDBOX", "bwrap")
    data = tmp_path / "data"
    (data / "jobs" / "j1").mkdir(parents=True)
    (data / "api_key").write_text("sk-very-secret")
    env_file = tmp_path / ".env"
    env_file.write_text("KZ_API_KEY=sk-very-secret")
    code = """
        import json, os, sys
        home = os.path.expanduser("~root")
        def read(path):
            try:
                return open(path).read()
            except OSError as exc:
                return type(exc).__name__
        open(os.path.join(sys.argv[1], "jobs", "j1", "out"), "w").write("done")
        print(json.dumps({
            "key": read(os.path.join(sys.argv[1], "api_key")),
            "env_file": read(sys.argv[2]),
            "home_files": [e.name for e in os.scandir(home) if not e.is_dir()],
            "run": os.listdir("/run"),
        }))
    """
    policy = Confinement(wall_timeout_s=20, hidden_dirs=(data, env_file), writable_dirs=(data / "jobs" / "j1",))
    _, seen = run_json(code, policy, str(data), str(env_file))
    assert seen == {"key": "FileNotFoundError", "env_file": "PermissionError", "home_files": [], "run": []}
    assert (data / "jobs" / "j1" / "out").read_text() == "done"


def test_environment_is_clean(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KZ_SECRET_TOKEN", "s3cr3t-value")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-s3cr3t")
    _, env = run_json(
        "import json, os; print(json.dumps(dict(os.environ)))", Confinement(wall_timeout_s=20, env={"TRITON_INTERPRET": "1"})
    )
    assert isinstance(env, dict)
    assert "s3cr3t" not in json.dumps(env)
    assert env["TRITON_INTERPRET"] == "1"
    # bwrap adds PWD for --chdir; nothing else beyond what the runner sets.
    assert set(env) <= {"PATH", "HOME", "TMPDIR", "LANG", "PWD", "TRITON_INTERPRET"}


def test_fallback_gets_a_private_tmpdir_removed_afterwards(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KZ_SANDBOX", "fallback")
    code = "import os; open(os.path.join(os.environ['TMPDIR'], 'f'), 'w').write('x'); print(os.environ['TMPDIR'], os.getcwd())"
    result = run_sandboxed(py(code), Confinement(wall_timeout_s=20))
    tmpdir, cwd = result.stdout.decode().split()
    assert tmpdir == cwd and tmpdir != "/tmp"
    assert not Path(tmpdir).exists()


def test_network_is_unreachable(mode: str) -> None:
    if mode == "fallback" and not FALLBACK_NAMESPACES:
        pytest.skip("the fallback without root has no network namespace")
    ports = []
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        ports.append(listener.getsockname()[1])
        try:  # the platform's Redis, where one runs
            socket.create_connection(("127.0.0.1", 6379), timeout=1).close()
            ports.append(6379)
        except OSError:
            pass
        code = """
            import json, socket, sys
            def attempt(port):
                try:
                    socket.create_connection(("127.0.0.1", int(port)), timeout=2).close()
                    return "connected"
                except OSError as exc:
                    return type(exc).__name__
            print(json.dumps([attempt(p) for p in sys.argv[1:]]))
        """
        _, outcome = run_json(code, Confinement(wall_timeout_s=20), *map(str, ports))
    assert isinstance(outcome, list) and len(outcome) == len(ports)
    assert "connected" not in outcome


def test_child_cannot_signal_processes_outside(mode: str) -> None:
    if mode == "fallback" and not FALLBACK_NAMESPACES:
        pytest.skip("the fallback without root has no PID namespace")
    victim = subprocess.Popen(["sleep", "60"])
    try:
        code = """
            import os, signal, sys
            try:
                os.kill(int(sys.argv[1]), signal.SIGKILL)
                print("sent")
            except OSError as exc:
                print(type(exc).__name__)
        """
        result = run_sandboxed(py(code, str(victim.pid)), Confinement(wall_timeout_s=20))
        assert result.stdout == b"ProcessLookupError\n"
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


def test_infinite_loop_times_out(mode: str) -> None:
    start = time.monotonic()
    result = run_sandboxed(py("while True: pass"), Confinement(wall_timeout_s=1.0))
    elapsed = time.monotonic() - start
    assert result.timed_out and result.signal == signal.SIGKILL and result.returncode is None
    assert 1.0 <= result.wall_s < 1.3 and elapsed < 2.0
    assert result.describe() == "timed out after 1.0 s"


# Grandchildren that double-fork into their own sessions (unreachable through the process group),
# note on a shared file that they are up, and sleep with a unique marker in their command line.
SPAWN_DAEMONS = """
    import os, sys, time
    marker_file, marker, then = sys.argv[1:4]
    for _ in range(3):
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                code = "import sys, time; open(sys.argv[1], 'a').write('up\\\\n'); time.sleep(300)"
                os.execv(sys.executable, [sys.executable, "-c", code, marker_file, marker])
            os._exit(0)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and open(marker_file).read().count("up") < 3:
        time.sleep(0.02)
    print("ready", flush=True)
    if then == "loop":
        while True:
            time.sleep(1)
"""


def survivors(marker: str) -> list[int]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if marker in (proc.info["cmdline"] or []):
            found.append(proc.pid)
    return found


@pytest.mark.parametrize("then", ["loop", "exit"])
def test_no_descendant_survives(mode: str, then: str, tmp_path: Path) -> None:
    if mode == "fallback" and then == "exit" and not FALLBACK_NAMESPACES:
        pytest.skip("without a PID namespace, orphaned daemons of an exited child are out of reach")
    marker = f"kz-sandbox-marker-{uuid.uuid4().hex}"
    marker_file = tmp_path / "up"
    marker_file.touch()
    policy = Confinement(wall_timeout_s=3.0 if then == "loop" else 20, writable_dirs=(tmp_path,))
    try:
        result = run_sandboxed(py(SPAWN_DAEMONS, str(marker_file), marker, then), policy)
        assert result.stdout == b"ready\n", result.stderr.decode()
        assert marker_file.read_text().count("up") == 3
        assert result.timed_out == (then == "loop")
        assert survivors(marker) == []
    finally:
        for pid in survivors(marker):
            os.kill(pid, signal.SIGKILL)


def test_segfault_reports_sigsegv(mode: str) -> None:
    result = run_sandboxed(py("import ctypes; ctypes.string_at(0)"), Confinement(wall_timeout_s=20))
    assert (result.returncode, result.signal, result.timed_out) == (None, signal.SIGSEGV, False)
    assert result.describe() == "killed by SIGSEGV"


def test_the_child_is_the_oom_killers_first_choice(mode: str) -> None:
    # GPU children have no address-space limit: when host memory runs out, the kernel must kill
    # the untrusted child (a verdict), not the worker that runs it; its descendants inherit it.
    code = """
        import json, subprocess, sys
        own = open("/proc/self/oom_score_adj").read().strip()
        grandchild = subprocess.run([sys.executable, "-c", "print(open('/proc/self/oom_score_adj').read().strip())"],
                                    capture_output=True, text=True).stdout.strip()
        print(json.dumps([own, grandchild]))
    """
    _, scores = run_json(code, Confinement(wall_timeout_s=20, memory_bytes=None))
    assert scores == ["1000", "1000"]
    assert open("/proc/self/oom_score_adj").read().strip() != "1000"  # the parent's own stays as it was


def test_memory_hog_fails_inside_the_child(mode: str) -> None:
    code = "x = bytearray(2 << 30); print('allocated')"
    result = run_sandboxed(py(code), Confinement(wall_timeout_s=20, memory_bytes=512 << 20))
    assert b"allocated" not in result.stdout
    assert result.returncode != 0
    assert b"MemoryError" in result.stderr or result.signal is not None


def test_huge_output_is_truncated_without_hanging(mode: str) -> None:
    code = """
        import sys
        chunk = b"x" * (1 << 20)
        for _ in range(30):
            sys.stdout.buffer.write(chunk)
            sys.stderr.buffer.write(chunk)
    """
    start = time.monotonic()
    result = run_sandboxed(py(code), Confinement(wall_timeout_s=20, max_output_bytes=100_000))
    assert time.monotonic() - start < 10
    assert result.returncode == 0
    assert result.stdout == b"x" * 100_000 and result.stderr == b"x" * 100_000
    assert result.stdout_truncated and result.stderr_truncated
    assert result.describe() == "exited 0; stdout and stderr truncated"


def test_warm_process_timer_starts_at_run(mode: str) -> None:
    code = """
        import sys, time
        job = sys.stdin.read()
        time.sleep(0.6)
        print(job.upper())
    """
    with SandboxProcess(py(code), Confinement(wall_timeout_s=1.5)) as proc:
        time.sleep(1.8)  # longer than the timeout: it must not count while the child waits
        assert proc.alive
        result = proc.run(b"kernel")
        assert not proc.alive
    assert not result.timed_out, result.describe()
    assert result.stdout == b"KERNEL\n"
    assert 0.6 <= result.wall_s < 1.5


def test_kill_before_run_is_idempotent(mode: str) -> None:
    proc = SandboxProcess(py("import time; time.sleep(60)"), Confinement(wall_timeout_s=5))
    assert proc.alive
    proc.kill()
    proc.kill()
    assert not proc.alive
    with pytest.raises(RuntimeError):
        proc.run()


def test_child_that_ignores_stdin_does_not_block_the_timeout(mode: str) -> None:
    result = run_sandboxed(py("import time; time.sleep(60)"), Confinement(wall_timeout_s=1.0), stdin=b"x" * (8 << 20))
    assert result.timed_out and result.wall_s < 1.5


def test_missing_writable_dir_is_an_error_in_the_parent(mode: str, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        SandboxProcess(["true"], Confinement(writable_dirs=(tmp_path / "absent",)))


def test_sandbox_available_honours_kz_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KZ_SANDBOX", "fallback")
    assert sandbox_available() == "fallback"
    monkeypatch.setenv("KZ_SANDBOX", "auto")
    assert sandbox_available() == ("bwrap" if HAS_BWRAP else "fallback")
    monkeypatch.setenv("KZ_SANDBOX", "chroot")
    with pytest.raises(ValueError):
        sandbox_available()
    monkeypatch.setenv("KZ_SANDBOX", "bwrap")
    if HAS_BWRAP:
        assert sandbox_available() == "bwrap"
    else:
        with pytest.raises(RuntimeError):
            sandbox_available()


def test_gpu_policy_exposes_only_nvidia_nodes() -> None:
    argv = bwrap_argv("bwrap", ["true"], Confinement(gpu=True), None)
    dev_binds = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--dev-bind"]
    assert all(path.startswith("/dev/nvidia") for path in dev_binds)
    assert "--cap-drop" in argv and "--unshare-net" in argv


@pytest.mark.parametrize(
    ("fields", "text"),
    [
        ({"returncode": 0}, "exited 0"),
        ({"returncode": None, "signal": 11}, "killed by SIGSEGV"),
        ({"returncode": None, "signal": 9}, "killed by SIGKILL (likely out of memory)"),
        ({"returncode": None, "signal": 24}, "killed by SIGXCPU (CPU time limit)"),
        ({"returncode": None, "signal": 9, "timed_out": True, "wall_s": 5.01}, "timed out after 5.0 s"),
        ({"returncode": 1, "stderr_truncated": True}, "exited 1; stderr truncated"),
    ],
)
def test_describe(fields: dict[str, object], text: str) -> None:
    base: dict[str, object] = dict(
        returncode=None,
        signal=None,
        timed_out=False,
        stdout=b"",
        stderr=b"",
        stdout_truncated=False,
        stderr_truncated=False,
        wall_s=0.1,
        isolation="bwrap",
    )
    assert SandboxResult(**(base | fields)).describe() == text  # type: ignore[arg-type]
