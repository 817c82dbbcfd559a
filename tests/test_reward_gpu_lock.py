"""The device lock across processes: correctness work shares it, timing excludes everything else."""

from __future__ import annotations

import fcntl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from processes import wait_for
from services.children.device import TIMINGS_SUFFIX, gpu_lock


@contextmanager
def child_holding(path: Path, *, exclusive: bool) -> Iterator[None]:
    """Another process holding the lock, as a child does around its GPU work."""
    code = (
        "import sys; from services.children.device import gpu_lock; "
        f"held = gpu_lock({str(path)!r}, exclusive={exclusive}); held.__enter__(); print('held', flush=True); sys.stdin.read()"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "held"
        yield
    finally:
        child.kill()
        child.wait()


def can_take(path: Path, mode: int) -> bool:
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True


def test_correctness_work_shares_the_device(tmp_path: Path) -> None:
    lock = tmp_path / "gpu.lock"
    with child_holding(lock, exclusive=False):
        assert can_take(lock, fcntl.LOCK_SH)
        with gpu_lock(str(lock)):  # the judge: returns at once beside a child's trials
            assert not can_take(lock, fcntl.LOCK_EX)  # but nobody may start timing meanwhile
    assert can_take(lock, fcntl.LOCK_EX)


@pytest.mark.parametrize("mode", [fcntl.LOCK_SH, fcntl.LOCK_EX])
def test_timing_excludes_every_other_holder(tmp_path: Path, mode: int) -> None:
    lock = tmp_path / "gpu.lock"
    with child_holding(lock, exclusive=True):
        assert not can_take(lock, mode)
    assert can_take(lock, mode)  # released when the child exits


def test_phases_charge_the_wait_and_the_work_separately(tmp_path: Path) -> None:
    import time

    from services.children.phases import Phases

    phases = Phases()
    time.sleep(0.05)  # host work before the block
    with phases.on_device(str(tmp_path / "gpu.lock"), "trials"):
        time.sleep(0.1)
    with phases.on_device(str(tmp_path / "gpu.lock"), "trials", exclusive=True):
        time.sleep(0.1)
    assert set(phases.seconds) == {"host", "lock_wait", "trials"}
    assert phases.seconds["host"] >= 0.05 and phases.seconds["trials"] >= 0.2 and phases.seconds["lock_wait"] < 0.05


def test_phases_tell_a_compile_and_the_wait_to_retake_the_device_from_the_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hold that lets the device go for a compile, during which a timing takes it, charges the
    compile to ``released`` and the wait for the timing to ``lock_wait``, not to the work."""
    import torch

    from services.children.device import device_released
    from services.children.phases import Phases

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # no first CUDA sync (a context) in the work's time

    lock = tmp_path / "gpu.lock"
    phases = Phases()
    with phases.on_device(str(lock), "trials"):
        time.sleep(0.05)  # GPU work
        with device_released():
            timing = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    "import time; from services.children.device import gpu_lock\n"
                    f"with gpu_lock({str(lock)!r}, exclusive=True): print('held', flush=True); time.sleep(0.4)",
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            assert timing.stdout is not None and timing.stdout.readline().strip() == "held"
            time.sleep(0.1)  # the compile
    timing.wait()
    assert phases.seconds["released"] >= 0.1  # the child's start and the compile
    assert phases.seconds["lock_wait"] >= 0.2  # the rest of the timing's 0.4 s
    assert 0.05 <= phases.seconds["trials"] < 0.15


def test_cpu_work_inside_a_shared_hold_lets_the_device_go(tmp_path: Path) -> None:
    from services.children.device import device_released

    lock = tmp_path / "gpu.lock"
    with gpu_lock(str(lock)):
        with device_released():
            assert can_take(lock, fcntl.LOCK_EX)  # a timing may run while this process compiles
        assert not can_take(lock, fcntl.LOCK_EX)  # and the hold is back for the GPU work after it
    with gpu_lock(str(lock), exclusive=True), device_released():
        assert not can_take(lock, fcntl.LOCK_SH)  # timing keeps its exclusive hold


def test_triton_compiles_outside_the_device_hold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from triton.runtime.jit import JITFunction

    from reward_svc.harness.candidate import _compile_triton_off_device

    lock = tmp_path / "gpu.lock"
    free_while_compiling: list[bool] = []
    monkeypatch.setattr(JITFunction, "_do_compile", lambda *_: free_while_compiling.append(can_take(lock, fcntl.LOCK_EX)))
    _compile_triton_off_device()
    with gpu_lock(str(lock)):
        JITFunction._do_compile(None)
        assert not can_take(lock, fcntl.LOCK_EX)
    assert free_while_compiling == [True]


def announced(lock: Path) -> bool:
    """Whether a timing has announced itself (it holds the timings file shared from its request on)."""
    return not can_take(Path(f"{lock}{TIMINGS_SUFFIX}"), fcntl.LOCK_EX)


def test_a_waiting_timing_is_not_overtaken_by_new_correctness_work(tmp_path: Path) -> None:
    """Linux flock would grant new shared holds while a timing waits, so under steady correctness
    work the timing could wait forever; an announced timing makes later correctness work wait."""
    lock = tmp_path / "gpu.lock"
    with child_holding(lock, exclusive=False):
        timing = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys; from services.children.device import gpu_lock\n"
                f"with gpu_lock({str(lock)!r}, exclusive=True):\n    print('timing', flush=True); sys.stdin.read()",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            wait_for(lambda: announced(lock) or timing.poll() is not None, 30, "a timing announced")
            assert timing.poll() is None
            entered = threading.Event()

            def correctness_work() -> None:
                with gpu_lock(str(lock)):
                    entered.set()

            later = threading.Thread(target=correctness_work, daemon=True)
            later.start()
            assert not entered.wait(1.0)  # queued behind the timing, though the lock is only held shared
        except BaseException:
            timing.kill()
            raise
    assert timing.stdout is not None and timing.stdout.readline().strip() == "timing"  # first holder gone: timing runs
    assert not entered.is_set()
    timing.kill()
    timing.wait()
    assert entered.wait(5.0)  # and then the correctness work
    later.join(5.0)


def test_timings_announced_while_the_device_drains_run_back_to_back(tmp_path: Path) -> None:
    """The drain (the GPU idling behind the slowest shared holder) is paid once per batch of timings:
    a timing announced after correctness work began to wait still runs before it, beside the first
    timing's batch, and the correctness work runs once the batch is done."""
    lock = str(tmp_path / "gpu.lock")
    order: list[str] = []

    def hold(name: str, exclusive: bool) -> threading.Thread:
        def run() -> None:
            with gpu_lock(lock, exclusive=exclusive):
                order.append(name)
                time.sleep(0.1)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    with gpu_lock(lock):  # a trial in progress
        first = hold("timing 1", exclusive=True)
        wait_for(lambda: announced(Path(lock)), 30, "the first timing announced")
        correctness = hold("correctness", exclusive=False)
        time.sleep(0.3)  # the correctness work is waiting now
        second = hold("timing 2", exclusive=True)
        time.sleep(0.3)
        assert order == []
    for thread in (first, second, correctness):
        thread.join(10)
    assert sorted(order[:2]) == ["timing 1", "timing 2"] and order[2:] == ["correctness"]
