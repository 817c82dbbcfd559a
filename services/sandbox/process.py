"""A sandboxed child process per evaluation, started before its job is known.

A pool can start children early (they import torch, initialise CUDA and then block on stdin)
and hand each one a job with ``run``; the wall-clock limit counts from then. Whatever happens,
``run`` ends with the child's whole process tree killed, so nothing it started survives the
evaluation. bwrap's ``--die-with-parent`` is tied to the *thread* that started the child:
start warm children from a long-lived thread, or they die when that thread exits.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

import psutil

from services.sandbox.bwrap import bwrap_argv, bwrap_probe
from services.sandbox.confinement import Confinement, SandboxResult
from services.sandbox.fallback import fallback_prefix
from services.sandbox.isolation import sandbox_available
from services.sandbox.limits import preexec, rlimits
from services.sandbox.output import OutputCollector

_PATH = "/usr/local/bin:/usr/bin:/bin"


class KilledBeforeRun(RuntimeError):
    """The process was killed before its job was sent (its owner is stopping)."""


class SandboxProcess:
    """A sandboxed child, started now and given its input later by ``run``."""

    def __init__(
        self, argv: Sequence[str], confinement: Confinement, cwd: Path | None = None, pass_fds: Sequence[int] = ()
    ) -> None:
        """``pass_fds``: descriptors the child inherits at the same numbers (a lock it may take, but
        whose file it cannot see); every other descriptor of this process is closed in the child."""
        if not argv:
            raise ValueError("argv is empty")
        missing = [str(p) for p in (*confinement.writable_dirs, *confinement.readonly_dirs) if not p.exists()]
        if missing:
            raise FileNotFoundError(f"sandbox dirs do not exist: {', '.join(missing)}")
        self.confinement = confinement
        self.isolation = sandbox_available()
        self._private_dir: str | None = None
        if self.isolation == "bwrap":
            bwrap, _ = bwrap_probe()
            assert bwrap is not None  # sandbox_available() said it works
            command = bwrap_argv(bwrap, argv, confinement, cwd)
            home = "/tmp"  # the sandbox's private tmpfs
            popen_cwd = "/"  # bwrap's own; --chdir sets the child's
        else:
            self._private_dir = home = tempfile.mkdtemp(prefix="kz-sandbox-")
            command = [*fallback_prefix(confinement.network), *argv]
            popen_cwd = str(cwd or home)
        env = {"PATH": _PATH, "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8", **confinement.env}
        self._lock = threading.Lock()
        self._ran = self._killed_before_run = False
        try:
            self._proc = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                cwd=popen_cwd,
                close_fds=True,
                pass_fds=tuple(pass_fds),
                start_new_session=True,  # own process group, and no controlling terminal
                preexec_fn=preexec(rlimits(confinement)),
            )
        except BaseException:
            self._remove_private_dir()
            raise
        # A pidfd signals exit at once and without reaping: the tree is walked from the unreaped
        # child, whose pid therefore cannot have been reused. Kernels without pidfds (gVisor)
        # get a polling wait that does not reap either.
        try:
            self._pidfd: int | None = os.pidfd_open(self._proc.pid)
        except (AttributeError, OSError):
            self._pidfd = None
        assert self._proc.stdout is not None and self._proc.stderr is not None
        self._output = OutputCollector((self._proc.stdout, self._proc.stderr), confinement.max_output_bytes)

    @property
    def alive(self) -> bool:
        return not self._exited(0)

    def run(self, stdin: bytes = b"", wall_timeout_s: float | None = None) -> SandboxResult:
        """Send ``stdin``, wait up to ``wall_timeout_s`` (the confinement's wall timeout unless given: a
        warm process started before its job's limit was known), kill the tree, report."""
        with self._lock:
            if self._killed_before_run:
                raise KilledBeforeRun("the sandboxed process was killed before its job was sent")
            if self._ran:
                raise RuntimeError("SandboxProcess.run may be called once")
            self._ran = True
        start = time.monotonic()
        assert self._proc.stdin is not None
        feeder = threading.Thread(target=_feed, args=(self._proc.stdin, stdin), name="sandbox-stdin", daemon=True)
        feeder.start()
        timed_out = not self._exited(self.confinement.wall_timeout_s if wall_timeout_s is None else wall_timeout_s)
        wall_s = time.monotonic() - start
        self.kill()
        feeder.join()
        out, err = self._output.finish()
        self._close_pidfd()
        status = self._proc.returncode
        sig: int | None = None
        if status < 0:
            sig = -status
        elif self.isolation == "bwrap" and 128 < status <= 128 + 64:
            sig = status - 128  # bwrap reports a child killed by signal N as exit 128+N
        result = SandboxResult(
            returncode=None if sig is not None else status,
            signal=sig,
            timed_out=timed_out,
            stdout=out.data,
            stderr=err.data,
            stdout_truncated=out.truncated,
            stderr_truncated=err.truncated,
            wall_s=wall_s,
            isolation=self.isolation,
        )
        from services.metrics import record_sandbox_ending  # here: the sandbox module stays free of the metrics stack

        record_sandbox_ending(
            self.isolation, timed_out=timed_out, signal=sig, returncode=result.returncode, oom=result.killed_for_memory
        )
        return result

    def kill(self) -> None:
        """Kill the whole process tree now; safe to call again or after the child exited."""
        with self._lock:
            if self._proc.returncode is None:
                # Once the child has exited its descendants are no longer linked to it: the
                # walk (a scan of all of /proc) would find nothing, so only the group is killed.
                _kill_tree(self._proc.pid, walk=not self._exited(0))
                self._proc.wait()
            self._remove_private_dir()
            if not self._ran:  # never to be run: release the pipes here, as run() would
                self._ran = self._killed_before_run = True
                assert self._proc.stdin is not None
                self._proc.stdin.close()
                self._output.finish()
                self._close_pidfd()

    def __enter__(self) -> SandboxProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()

    def _exited(self, timeout_s: float) -> bool:
        if self._proc.returncode is not None:
            return True
        if self._pidfd is not None:
            poller = select.poll()  # not select(): a busy service may hold fds past FD_SETSIZE
            poller.register(self._pidfd, select.POLLIN)
            return bool(poller.poll(timeout_s * 1e3))
        deadline = time.monotonic() + timeout_s
        while os.waitid(os.P_PID, self._proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
        return True

    def _close_pidfd(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)

    def _remove_private_dir(self) -> None:
        if self._private_dir is not None:
            shutil.rmtree(self._private_dir, ignore_errors=True)
            self._private_dir = None


def run_sandboxed(argv: Sequence[str], confinement: Confinement, stdin: bytes = b"", cwd: Path | None = None) -> SandboxResult:
    """Start a sandboxed child and run it to the end."""
    return SandboxProcess(argv, confinement, cwd).run(stdin)


def _feed(stream: IO[bytes], data: bytes) -> None:
    # Its own thread: a child that never reads stdin must not block the timeout. A child that
    # exits or dies without reading it all is no error of the runner's (EPIPE).
    try:
        stream.write(data)
    except OSError:
        pass
    finally:
        try:
            stream.close()
        except OSError:
            pass


def _kill_tree(leader: int, walk: bool) -> None:
    """SIGKILL the child, its process group and (``walk``) every descendant still linked to it.

    Descendants that called setsid() are reached through the tree, not the group. Under bwrap
    or unshare the child is a PID namespace, whose end also kills anything reparented inside it.
    """
    frozen = _freeze_tree(leader) if walk else []
    try:
        os.killpg(leader, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for proc in frozen:
        try:
            proc.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass


def _freeze_tree(leader: int) -> list[psutil.Process]:
    """SIGSTOP the child and its descendants, listing again until no new one appears: a stopped
    process cannot fork, so the walk ends with the whole linked tree frozen."""
    try:
        root = psutil.Process(leader)
    except psutil.NoSuchProcess:
        return []
    seen: dict[int, psutil.Process] = {}
    todo = [root]
    while todo:
        for proc in todo:
            seen[proc.pid] = proc
            try:
                proc.suspend()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        try:
            todo = [c for c in root.children(recursive=True) if c.pid not in seen]
        except psutil.NoSuchProcess:
            break
    return list(seen.values())
