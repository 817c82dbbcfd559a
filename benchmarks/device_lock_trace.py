"""What the device lock was doing while a benchmark ran: ``/proc/locks`` sampled every few
milliseconds for the lock file and its timings file (``services/children/device.py``), told into
states (a timing holds the device, a timing waits for the shared holders to drain, correctness work
shares it, nobody holds it), with every drain's length, what its holders were doing at each sample
(on a CPU, or where in the kernel they slept) and, for the long ones, the Python stacks of the
holders it waited for (``py-spy dump``, where py-spy is installed): what a timing waits behind.

Used by ``kernelbench_throughput.py run`` on a GPU; on its own, beside any run on the same machine:

    python benchmarks/device_lock_trace.py /tmp/kz/reward/locks/gpu.lock --seconds 60
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer

from services.children.device import TIMINGS_SUFFIX


@dataclass
class LockState:
    """One sample of the two files' flocks: pids holding and waiting, by mode."""

    exclusive: list[int] = field(default_factory=list)  # holding the device lock for a timing
    exclusive_waiting: list[int] = field(default_factory=list)  # timings waiting for the drain
    shared: list[int] = field(default_factory=list)  # correctness work on the device (a pid per hold)
    announced: int = 0  # timings announced (holding the timings file shared)
    correctness_waiting: int = 0  # correctness work waiting for the announced timings to end

    @property
    def name(self) -> str:
        if self.exclusive:
            return "timing"
        if self.exclusive_waiting:
            return "drain" if self.shared else "handover"
        if self.shared:
            return "shared"
        return "waiting" if self.correctness_waiting else "free"


def read_state(lock_inode: int, timings_inode: int, text: str) -> LockState:
    """``/proc/locks`` lines: ``id: [->] FLOCK ADVISORY READ|WRITE pid maj:min:inode start end``
    (a ``->`` marks a request that waits)."""
    state = LockState()
    for line in text.splitlines():
        parts = line.split()
        waiting = len(parts) > 1 and parts[1] == "->"
        fields = parts[2:] if waiting else parts[1:]
        if len(fields) < 5 or fields[0] != "FLOCK":
            continue
        mode, pid, inode = fields[2], int(fields[3]), int(fields[4].rsplit(":", 1)[-1])
        if inode == lock_inode:
            if mode == "WRITE":
                (state.exclusive_waiting if waiting else state.exclusive).append(pid)
            elif not waiting:
                state.shared.append(pid)
        elif inode == timings_inode:
            if mode == "READ" and not waiting:
                state.announced += 1
            elif mode == "WRITE" and waiting:
                state.correctness_waiting += 1
    return state


class DeviceLockTrace:
    """Samples the lock in a thread while a ``with`` block runs; ``summary()`` after it."""

    def __init__(self, lock_path: str, interval_s: float = 0.005, long_drain_s: float = 1.0, dumps: int = 24) -> None:
        for path in (lock_path, lock_path + TIMINGS_SUFFIX):
            Path(path).touch()
        self.lock_inode, self.timings_inode = os.stat(lock_path).st_ino, os.stat(lock_path + TIMINGS_SUFFIX).st_ino
        self.interval_s, self.long_drain_s, self.dumps_left = interval_s, long_drain_s, dumps
        self.seconds: Counter[str] = Counter()
        self.drains: list[float] = []
        self.timing_batches: list[float] = []
        self.holders_running: Counter[str] = Counter()  # during drains: whether a holder was on a CPU
        self.holder_states: Counter[str] = Counter()  # during drains: each holder's role and state (``holder_state``)
        self.stacks: list[dict[str, Any]] = []
        self._py_spy = shutil.which("py-spy") or next((p for p in ("/tmp/kz-site/bin/py-spy",) if os.path.exists(p)), None)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._dumper: threading.Thread | None = None

    def __enter__(self) -> DeviceLockTrace:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if self._dumper is not None:  # the last long drain's stacks belong in the summary
            self._dumper.join(timeout=30)

    def _run(self) -> None:
        last = time.perf_counter()
        drain_since: float | None = None  # a timing waits for the shared holders to go
        batch_since: float | None = None  # timings hold the device, back to back
        dumped: float | None = None
        while not self._stop.wait(self.interval_s):
            with open("/proc/locks") as handle:
                state = read_state(self.lock_inode, self.timings_inode, handle.read())
            now = time.perf_counter()
            self.seconds[state.name] += now - last
            last = now
            if state.exclusive_waiting and not state.exclusive:
                drain_since = drain_since or now
            elif drain_since is not None:
                self.drains.append(now - drain_since)
                drain_since = None
            if state.exclusive:
                batch_since = batch_since or now
            elif batch_since is not None:
                self.timing_batches.append(now - batch_since)
                batch_since = None
            if state.name == "drain":
                states = [holder_state(pid) for pid in set(state.shared)]
                self.holders_running["running" if any(s.endswith(" running") for s in states) else "not running"] += 1
                self.holder_states.update(states)
                if drain_since is not None and now - drain_since > self.long_drain_s and dumped != drain_since:
                    dumped = drain_since
                    self._dump(state.shared, now - drain_since)

    def _dump(self, pids: list[int], waited_s: float) -> None:
        """The holders' Python stacks, once per long drain (in a thread: the sampling goes on)."""
        if not self._py_spy or self.dumps_left <= 0 or (self._dumper and self._dumper.is_alive()):
            return
        self.dumps_left -= 1

        def dump() -> None:
            for pid in sorted(set(pids))[:3]:
                run = subprocess.run([self._py_spy, "dump", "--pid", str(pid), "--nonblocking"], capture_output=True, text=True)
                self.stacks.append(
                    {"drain_so_far_s": round(waited_s, 2), "pid": pid, "stack": busy_threads(run.stdout or run.stderr)[:3000]}
                )

        self._dumper = threading.Thread(target=dump, daemon=True)
        self._dumper.start()

    def summary(self) -> dict[str, Any]:
        total = sum(self.seconds.values()) or 1.0
        return {
            "share_of_time": {name: round(s / total, 3) for name, s in self.seconds.most_common()},
            "seconds": round(total, 1),
            "drains": _spread(self.drains),
            "timing_batches": _spread(self.timing_batches),
            "drain_samples_with_a_holder_on_a_cpu": dict(self.holders_running),
            "holder_states_in_drains": dict(self.holder_states.most_common(20)),
            "long_drain_stacks": self.stacks,
        }


def holder_state(pid: int) -> str:
    """A lock holder's role (``worker``: this process, whose judge threads hold the lock beside its idle
    ones; ``child``: a sandboxed job) and state: ``running`` where any of its threads is on a CPU (the
    holding thread need not be the main one), else where its main thread sleeps in the kernel (its
    wchan: a futex is a lock or the GIL, a pipe write a full output pipe, an ioctl the GPU driver)."""
    role = "worker" if pid == os.getpid() else "child"
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return f"{role} gone"
    me = str(threading.get_native_id())  # the sampling thread itself is always on a CPU while it reads
    if any(_task_state(f"/proc/{pid}/task/{tid}") == "R" for tid in tasks if tid != me):  # stops at the first
        return f"{role} running"
    try:
        wchan = Path(f"/proc/{pid}/wchan").read_text().strip()
    except OSError:
        wchan = ""
    return f"{role} {_task_state(f'/proc/{pid}')} in {wchan if wchan not in ('', '0') else 'user space'}"


def _task_state(proc_dir: str) -> str:
    try:
        return Path(proc_dir, "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "?"


def busy_threads(dump: str) -> str:
    """A ``py-spy dump``: its header and the threads it saw active (the main thread where none was):
    a worker's dozens of idle threads would crowd out the one holding the lock."""
    header, *threads = re.split(r"\n(?=Thread \d+)", dump)
    active = [t for t in threads if "(active)" in t.split("\n", 1)[0]]
    kept = active or [t for t in threads if '"MainThread"' in t.split("\n", 1)[0]]
    return "\n".join([header, *kept])


def _spread(values: list[float]) -> dict[str, float | int]:
    if not values:
        return {"count": 0}
    ordered = sorted(values)
    return {
        "count": len(values),
        "total_s": round(sum(values), 1),
        "p50_s": round(statistics.median(values), 3),
        "p90_s": round(ordered[int(0.9 * (len(values) - 1))], 3),
        "max_s": round(ordered[-1], 3),
    }


def main(lock_path: str, seconds: float = typer.Option(60.0, help="how long to sample")) -> None:
    """Sample the device lock at ``lock_path`` for ``seconds`` and print the summary as JSON."""
    with DeviceLockTrace(lock_path) as trace:
        time.sleep(seconds)
    print(json.dumps(trace.summary(), indent=1))


if __name__ == "__main__":
    typer.run(main)
