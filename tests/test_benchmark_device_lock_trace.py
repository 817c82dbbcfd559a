"""``benchmarks/device_lock_trace.py`` against real flocks, so the states the throughput benchmark
reports (a timing draining the shared holders, timings back to back) cannot silently misread
``/proc/locks``."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

from services.children.device import TIMINGS_SUFFIX

TRACE = Path(__file__).resolve().parents[1] / "benchmarks" / "device_lock_trace.py"


def _trace_module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("device_lock_trace", TRACE)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _holder(lock: Path, *, exclusive: bool, hold_s: float) -> subprocess.Popen[str]:
    """A process that takes the lock, says ``held`` once it has, and keeps it ``hold_s``."""
    code = (
        "import time; from services.children.device import gpu_lock\n"
        f"with gpu_lock({str(lock)!r}, exclusive={exclusive}):\n    print('held', flush=True); time.sleep({hold_s})"
    )
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def _held(holder: subprocess.Popen[str]) -> None:
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"


def test_a_timing_waiting_behind_a_shared_holder_reads_as_a_drain(tmp_path: Path) -> None:
    trace = _trace_module()
    lock = tmp_path / "gpu.lock"
    with trace.DeviceLockTrace(str(lock)) as sampled:
        correctness = _holder(lock, exclusive=False, hold_s=1.2)
        _held(correctness)  # the shared hold is in place before the timing asks
        timing = _holder(lock, exclusive=True, hold_s=0.4)
        correctness.wait()
        timing.wait()
        time.sleep(0.1)
    summary = sampled.summary()
    assert summary["drains"]["count"] == 1
    # until the shared holder let go (its 1.2-s hold, give or take the sampling: on a loaded machine a sample reads
    # every holder's threads, so one may come late)
    assert 0.2 < summary["drains"]["p50_s"] < 1.6
    assert summary["timing_batches"]["count"] == 1 and 0.3 < summary["timing_batches"]["p50_s"] < 1.0
    assert {"drain", "timing", "shared"} <= set(summary["share_of_time"])


def test_the_states_read_from_proc_locks(tmp_path: Path) -> None:
    trace = _trace_module()
    lock = tmp_path / "gpu.lock"
    lock.touch()
    Path(f"{lock}{TIMINGS_SUFFIX}").touch()
    inodes = lock.stat().st_ino, Path(f"{lock}{TIMINGS_SUFFIX}").stat().st_ino
    holder = _holder(lock, exclusive=True, hold_s=2.0)
    try:
        _held(holder)
        state = trace.read_state(*inodes, Path("/proc/locks").read_text())
        assert state.exclusive == [holder.pid] and state.announced == 1 and state.name == "timing"
    finally:
        holder.kill()
        holder.wait()


def _process(code: str) -> subprocess.Popen[str]:
    """A process running ``code`` that says ``ready`` first."""
    return subprocess.Popen([sys.executable, "-c", "print('ready', flush=True)\n" + code], stdout=subprocess.PIPE, text=True)


def test_a_holder_is_running_when_any_of_its_threads_is_not_only_its_main_one() -> None:
    trace = _trace_module()
    spinning = _process(
        "import threading, time\nthreading.Thread(target=lambda: [0 for _ in iter(int, 1)]).start()\ntime.sleep(30)"
    )
    sleeping = _process("import time\ntime.sleep(30)")
    try:
        for process in (spinning, sleeping):
            assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        time.sleep(0.3)  # the spinning thread is up
        assert trace.holder_state(spinning.pid) == "child running"
        assert trace.holder_state(sleeping.pid).startswith("child S in ")  # where its main thread sleeps
        assert trace.holder_state(sleeping.pid) != "child running"
    finally:
        for process in (spinning, sleeping):
            process.kill()
            process.wait()


def test_a_stack_dump_keeps_the_busy_threads_of_a_holder() -> None:
    trace = _trace_module()
    dump = (
        "Process 7: python worker\nPython v3.12.3 (/usr/bin/python3.12)\n\n"
        'Thread 1 (idle): "MainThread"\n    wait (threading.py:359)\n'
        'Thread 2 (idle): "sandbox-output"\n    select (selectors.py:468)\n'
        'Thread 3 (active): "output-stream"\n    compare (reward_svc/verify.py:723)\n'
    )
    kept = trace.busy_threads(dump)
    assert kept.startswith("Process 7: python worker") and "compare (reward_svc/verify.py:723)" in kept
    assert "sandbox-output" not in kept and "MainThread" not in kept
    idle_only = dump.replace("(active)", "(idle)")
    assert '"MainThread"' in trace.busy_threads(idle_only) and "output-stream" not in trace.busy_threads(idle_only)


def test_the_tracing_process_is_the_worker_and_its_sampling_thread_does_not_count() -> None:
    trace = _trace_module()
    states = [trace.holder_state(os.getpid()) for _ in range(20)]
    assert all(state.startswith("worker ") for state in states)
    assert states.count("worker running") < len(states)  # the sampler, the one thread running here, does not count
