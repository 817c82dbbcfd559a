"""Capacity: trial tensors cross between children as files, so an evaluation whose tensors are
large runs fewer correctness cases, and candidates whose outputs would fill the disk together wait."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from processes import leftovers
from reward_cases import CORRECT, HACKS, RELU_REFERENCE, candidate
from reward_svc.admission import (
    DEVICE_CONTEXT_BYTES,
    ByteBudget,
    ChildSlots,
    DeviceUsers,
    ReferencePeaks,
    after_shortage,
    device_budget,
)
from reward_svc.evaluate import MEMORY_RETRIES, Evaluation, Evaluator, child_slots
from reward_svc.harness.reference import cases_within
from reward_svc.shared_builds import HARNESS_CHILD
from services.children.device import likely_device
from services.children.layout import Layout, owner_tag
from services.children.pool import Child, ChildPool, PoolClosed
from services.config import Settings
from services.sandbox import Confinement, run_sandboxed
from services.sandbox.bwrap import bwrap_probe
from services.schemas.reward import ScoreOptions, Verdict

GIB = 1 << 30


def test_cases_fit_the_exchange_budget() -> None:
    assert cases_within(3, case_bytes=10, budget=None) == 3
    assert cases_within(5, case_bytes=10, budget=35) == 3
    assert cases_within(3, case_bytes=10, budget=1000) == 3
    assert cases_within(3, case_bytes=13 << 30, budget=16 << 30) == 2  # a KernelBench level-1 case: two, for the refresh trial
    assert cases_within(1, case_bytes=13 << 30, budget=16 << 30) == 1  # one asked for


def _correct_beside_hacks(settings: Settings, names: list[str]) -> tuple[Evaluation, Verdict, list[Verdict]]:
    """The correct ReLU and the named hacks scored as one group on the CPU, checked to pass and to be
    caught: (the evaluation, the correct one's verdict, the hacks' verdicts in the order named)."""
    evaluator = Evaluator(settings)
    try:
        evaluation = evaluator.evaluate_group(
            RELU_REFERENCE,
            [CORRECT] + [HACKS[n][0] for n in names],
            ScoreOptions(backend="triton", device="cpu", trials=3, timeout_s=120),
        )
    finally:
        evaluator.close()
    correct, *hacks = evaluation.verdicts
    assert correct.status == "correct", correct.reason
    for name, verdict in zip(names, hacks):
        assert not verdict.correct, f"{name}: {verdict.reason}"
    return evaluation, correct, hacks


def test_cut_cases_still_catch_caches_and_decoys(kz_env: Callable[..., Settings]) -> None:
    """With the budget below one case's tensors two cases run, the least that still has a refresh
    trial: every cache and decoy must still be caught."""
    names = ["cache_by_shape", "cache_by_address", "cache_by_content", "decoy_scratch_kernel"]
    evaluation, correct, hacks = _correct_beside_hacks(
        kz_env(reward_warm_children=0, reward_parallel_children=2, reward_exchange_max_bytes=1), names
    )
    assert evaluation.reference["cases"] == 2
    assert "2 of 3 correctness trials" in correct.details["trials_cut"]
    waits = correct.details["seconds"]["waiting"]
    assert set(waits) == {
        "slot",
        "admission",
        "device_memory",
        "child",
        "retries",
        "reference_admission",
        "reference_slot",
        "reference_device_memory",
        "reference_child",
        "reference_retries",
    }
    assert waits["retries"] == 0 and waits["reference_retries"] == 0
    # no warm children: each was started when taken, and its warm-up (torch's import alone) is its wait
    assert waits["child"] > 0.3 and waits["reference_child"] > 0.3, waits
    for name, verdict in zip(names, hacks):
        guards = ("decoy_kernel", "conditional_fallback", "cross_call_cache", "no_custom_kernel")
        assert verdict.guard in guards or verdict.status == "incorrect", name


def test_more_outputs_in_flight_keep_the_verdicts(kz_env: Callable[..., Settings]) -> None:
    """A candidate may run ahead of the judge by several outputs (KZ_REWARD_OUTPUTS_IN_FLIGHT): every
    output is still judged, and what the refresh and the knockout catch is still caught."""
    names = ["cache_by_content", "skips_the_refresh_trial", "decoy_scratch_kernel"]
    _correct_beside_hacks(kz_env(reward_warm_children=0, reward_parallel_children=2, reward_outputs_in_flight=4), names)


def test_outputs_beyond_the_budget_wait_and_an_oversized_one_runs_alone() -> None:
    budget = ByteBudget(capacity=100)
    running: list[int] = []
    peak: list[int] = []
    lock = threading.Lock()

    def child(nbytes: int) -> None:
        with budget.reserve(nbytes):
            with lock:
                running.append(nbytes)
                peak.append(sum(running))
            time.sleep(0.05)
            with lock:
                running.remove(nbytes)

    threads = [threading.Thread(target=child, args=(n,)) for n in (60, 60, 30, 250, 10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert not any(t.is_alive() for t in threads)
    assert budget.in_use == 0
    assert all(p <= 100 or p == 250 for p in peak)  # within the budget, or the oversized one alone


def test_references_queue_while_the_files_in_use_fill_the_budget_and_candidates_never_wait_for_them() -> None:
    budget = ByteBudget(capacity=100)
    started = threading.Event()

    def next_reference() -> None:
        budget.wait_for_room()
        started.set()

    with budget.hold(60):  # a group's reference files
        budget.wait_for_room()  # 60 < 100: a second reference may start
        with budget.hold(70):
            waiting = threading.Thread(target=next_reference, daemon=True)
            waiting.start()
            assert not started.wait(0.3)  # 130 in use: the third waits
            with budget.reserve(90):  # but a candidate of a running group does not wait for references
                pass
        assert started.wait(5)  # 60 in use: room again
    assert budget.in_use == 0


def test_a_scratch_dir_outside_the_data_dir_is_hidden_from_children(kz_env: Callable[..., Settings], tmp_path: Path) -> None:
    """Children see their own work dir and the exchange, never another job's files (a reference's
    expected outputs lie in its work dir)."""
    if bwrap_probe()[0] is None:
        pytest.skip("hidden dirs need bwrap")
    scratch = Path(tempfile.mkdtemp(dir="/var/tmp"))  # not under /tmp: the sandbox's private /tmp would hide it anyway
    settings = kz_env(reward_warm_children=0, reward_scratch_dir=scratch, sandbox="bwrap")
    layout = Layout(settings.data_dir / "reward", scratch=settings.reward_scratch_dir).create()
    pool = ChildPool(settings, layout, "cpu", 30.0, size=0, entry=HARNESS_CHILD)
    try:
        mine, other = layout.jobs / f"{os.getpid()}-mine", layout.jobs / f"{os.getpid()}-other"
        for workdir in (mine, other):
            workdir.mkdir()
        (other / "expected_0.pt").write_text("the reference's answer")
        code = "import os, sys; print(os.path.exists(sys.argv[1]), os.path.exists(sys.argv[2]))"
        result = run_sandboxed([sys.executable, "-c", code, str(mine), str(other / "expected_0.pt")], pool.confinement(mine))
        assert result.stdout.decode().split() == ["True", "False"], result.stderr.decode()
    finally:
        pool.close()
        shutil.rmtree(scratch)


def test_work_dirs_of_dead_workers_are_swept(tmp_path: Path) -> None:
    """A worker killed mid-job leaves its children's dirs behind; the next one to start removes them."""
    layout = Layout(tmp_path / "reward", scratch=tmp_path / "scratch").create()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    started_before = (
        int(owner_tag().split(".")[1]) - 5000
    )  # this pid, 50 s before this process started: a restarted container's worker
    orphans = [
        layout.jobs / f"{dead.pid}.1-a",
        layout.exchange / f"{dead.pid}.1-a",
        layout.jobs / "unowned",
        layout.jobs / f"{os.getpid()}.{started_before}-c",
        layout.jobs / f"{os.getpid()}-d",
    ]
    live = layout.jobs / f"{owner_tag()}-b"
    for path in [*orphans, live]:
        path.mkdir()
        (path / "inputs_0.pt").write_bytes(b"GBs")
    layout.create()
    assert live.exists() and not any(path.exists() for path in orphans)


def test_a_group_whose_reference_finds_no_room_on_the_filesystem_gets_the_reason(kz_env: Callable[..., Settings]) -> None:
    """Groups admitted together can each fit the exchange budget and still not fit the scratch
    filesystem together: the reference stops before it fills it, the group waits for other groups'
    files to go and runs again; with none in use it ends with the reason, and the worker serves on."""
    settings = kz_env(reward_scratch_min_free_bytes=1 << 60)  # more than any filesystem here has
    evaluator = Evaluator(settings)
    try:
        started = time.monotonic()
        verdict = evaluator.evaluate_group(RELU_REFERENCE, [CORRECT], ScoreOptions(device="cpu")).verdicts[0]
        assert verdict.status == "runtime_error" and "no room for the trial tensors" in verdict.reason, verdict.reason
        assert "KZ_REWARD_SCRATCH_MIN_FREE_BYTES" in verdict.reason and time.monotonic() - started < 60  # no wait: nothing held
        assert not list(evaluator.layout.exchange.iterdir())
    finally:
        evaluator.close()


def test_a_reference_waiting_for_room_runs_once_another_group_lets_its_files_go() -> None:
    budget = ByteBudget(100)
    assert not budget.wait_for_release(timeout_s=5)  # nothing in use: waiting would not help
    released = threading.Event()

    def other_group() -> None:
        with budget.hold(60):
            time.sleep(0.3)
        released.set()

    thread = threading.Thread(target=other_group)
    thread.start()
    while budget.in_use == 0:
        time.sleep(0.01)
    assert budget.wait_for_release(timeout_s=10) and released.wait(5)
    thread.join()


def test_a_reference_short_of_room_after_two_cases_keeps_those(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the two cases the refresh trial needs, a reference that would take the filesystem below
    its free minimum stops there (its group runs on fewer trials) and leaves no file of the third."""
    from reward_svc.harness import reference

    checks = []
    room = reference._room_for

    def room_for(scratch: Path, nbytes: int, spec: dict) -> bool:  # the real check, until the third case's
        checks.append(nbytes)
        return room(scratch, nbytes, spec) and len(checks) < 3

    monkeypatch.setattr(reference, "_room_for", room_for)
    (tmp_path / "reference.py").write_text(RELU_REFERENCE)
    result = reference.run_reference(
        {"reference_path": str(tmp_path / "reference.py"), "device": "cpu", "trials": 4, "input_seed": 1, "weight_seeds": [2, 3]},
        tmp_path,
    )
    assert result["status"] == "ok" and result["cases"] == 2 and len(result["rounding_noise"]) == 2
    assert sorted(p.name for p in (tmp_path / "exchange").iterdir()) == ["init_0.pt", "init_1.pt", "inputs_0.pt", "inputs_1.pt"]
    assert sorted(p.name for p in tmp_path.glob("expected_*.pt")) == ["expected_0.pt", "expected_1.pt"]


def test_a_free_slot_goes_to_the_group_running_fewest_then_to_the_oldest() -> None:
    slots = ChildSlots(2)
    granted: list[tuple[int, int]] = []
    release = {key: threading.Event() for key in [(0, 0), (0, 1), (2, 0), (1, 1), (1, 0), (2, 1), (0, 2)]}

    def candidate(key: tuple[int, int]) -> None:
        with slots.take(key):
            granted.append(key)
            release[key].wait(10)

    threads = {key: threading.Thread(target=candidate, args=(key,), daemon=True) for key in release}
    for key in [(0, 0), (0, 1)]:  # group 0 alone: it takes both
        threads[key].start()
    _wait_until(lambda: len(granted) == 2)
    for key in list(release)[2:]:  # the others queue in an order that is not their keys'
        threads[key].start()
        _wait_until(lambda key=key: key in slots.waiting)
    assert slots.free == 0 and len(slots.waiting) == 5
    for n in range(len(release)):
        release[granted[n]].set()  # the longest-held slot frees, and goes to the next in line
        _wait_until(lambda n=n: len(granted) == min(len(release), n + 3))
    # group 1 (none running) before group 0's third; then group 0 and 1 with one each, group 2 with none
    assert granted == [(0, 0), (0, 1), (1, 0), (0, 2), (1, 1), (2, 0), (2, 1)]
    for thread in threads.values():
        thread.join(5)
    assert slots.free == 2 and slots.waiting == []


def test_a_slot_beyond_a_groups_even_share_waits_until_its_device_memory_fits() -> None:
    """Five slots, two groups: each group's even share is two. Group 0 holds two, so its third
    candidate, which does not fit the device memory, leaves the free slots free; group 1's candidate,
    within its share, goes though it does not fit either (it waits for memory in its slot, as before).
    Once the memory fits, group 0's third goes beyond its share."""
    slots = ChildSlots(5)
    fits = {"memory": False}
    granted: list[tuple[int, int]] = []
    done = threading.Event()

    def candidate(key: tuple[int, int]) -> None:
        with slots.take(key, lambda: fits["memory"]):
            granted.append(key)
            done.wait(10)

    with contextlib.ExitStack() as group_0:
        for key in [(0, 0), (0, 1)]:
            group_0.enter_context(slots.take(key))
        with slots.take((1, -1)):  # group 1's reference
            extra = threading.Thread(target=candidate, args=((0, 2),), daemon=True)
            extra.start()
            _wait_until(lambda: (0, 2) in slots.waiting)
            time.sleep(0.2)
            assert granted == [] and slots.free == 2
            within_share = threading.Thread(target=candidate, args=((1, 0),), daemon=True)
            within_share.start()
            _wait_until(lambda: granted == [(1, 0)])
            time.sleep(0.2)
            assert granted == [(1, 0)] and slots.free == 1
            fits["memory"] = True
        _wait_until(lambda: granted == [(1, 0), (0, 2)])  # the reference's release woke the line; it fits now
        done.set()
        for thread in (extra, within_share):
            thread.join(5)
    assert slots.free == 5 and slots.waiting == []


def test_a_gpu_workers_slots_are_shared_by_its_groups_and_a_cpu_process_runs_one_group() -> None:
    gpu_worker = Settings(reward_parallel_children=3, reward_gpu_concurrency=4, gpu_devices=[0])
    assert child_slots(gpu_worker, 1) == 12  # a group alone may take all twelve
    assert child_slots(gpu_worker, 6) == 18  # a caller with more groups at once gets three for each
    assert child_slots(Settings(reward_parallel_children=3, reward_gpu_concurrency=4), 1) == 3


def test_a_take_interrupted_in_line_leaves_the_line() -> None:
    """A time limit raised in a thread waiting for a slot (Celery's soft limit) must not leave its key
    at the head of the line, where every later take would wait behind it with a slot free."""
    slots = ChildSlots(1)

    def interrupted() -> None:
        with pytest.raises(TimeoutError), slots.take((0, 0)):
            pass

    with slots.take((-1, 0)):
        original = slots._changed.wait_for
        slots._changed.wait_for = lambda *a, **k: (_ for _ in ()).throw(TimeoutError())  # type: ignore[method-assign]
        interrupted()
        slots._changed.wait_for = original  # type: ignore[method-assign]
        assert slots.waiting == []
    with slots.take((1, 0)):
        assert slots.free == 0
    assert slots.free == 1


def test_references_and_candidates_of_a_workers_groups_share_its_slots(
    kz_env: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CPU worker's process with one child a group: its slots are one for each group in flight. With
    a slot held by this test, the first group's reference waits in line for it; the second group's
    arrival adds a slot, which the first reference takes, and the second reference waits for the held
    one. A reference runs in a slot as its candidates do, so no more children than slots ever run."""
    evaluator = Evaluator(kz_env(reward_warm_children=2, reward_parallel_children=1))
    slots = evaluator.slots
    results: dict[str, Evaluation] = {}
    options = ScoreOptions(device="cpu", timeout_s=120)
    running, peak, counting = [0], [0], threading.Lock()
    run = Child.run

    def counted_run(child: Child, *args: Any, **kwargs: Any) -> Any:
        with counting:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        try:
            return run(child, *args, **kwargs)
        finally:
            with counting:
                running[0] -= 1

    monkeypatch.setattr(Child, "run", counted_run)

    def group(name: str, candidates: list[str]) -> None:
        results[name] = evaluator.evaluate_group(RELU_REFERENCE, candidates, options)

    try:
        with slots.take((-1, 0)):
            first = threading.Thread(target=group, args=("first", [CORRECT] * 3))
            first.start()
            _wait_until(lambda: slots.waiting == [(0, -1)], timeout_s=120)
            assert slots.size == 1 and peak[0] == 0
            second = threading.Thread(target=group, args=("second", [CORRECT]))
            second.start()
            _wait_until(lambda: (1, -1) in slots.waiting and (0, -1) not in slots.waiting, timeout_s=120)
            assert slots.size == 2
            time.sleep(0.5)
        first.join(300)
        second.join(300)
        verdicts = results["first"].verdicts + results["second"].verdicts
        assert [v.status for v in verdicts] == ["correct"] * 4
        assert results["first"].verdicts[0].details["seconds"]["waiting"]["reference_slot"] > 0
        assert results["second"].verdicts[0].details["seconds"]["waiting"]["reference_slot"] >= 0.5  # behind the held slot
        assert peak[0] == 2  # two at once (the slots), never a third beside them
        assert slots.size == 1 and slots.free == 1 and slots.waiting == []
    finally:
        evaluator.close()


def _wait_until(condition: Callable[[], bool], timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_device_users_tell_a_shortage_of_others_from_ones_own() -> None:
    users = DeviceUsers()
    with users.use() as seen:
        pass
    assert not users.others_finished_since(seen, timeout_s=5)  # alone: no one else held the memory
    other_started, other_may_end = threading.Event(), threading.Event()

    def other() -> None:
        with users.use():
            other_started.set()
            other_may_end.wait(5)

    thread = threading.Thread(target=other)
    thread.start()
    other_started.wait(5)
    with users.use() as seen:
        pass
    assert not users.others_finished_since(seen, timeout_s=0.2)  # the other still runs: time is up
    threading.Timer(0.3, other_may_end.set).start()
    assert users.others_finished_since(seen, timeout_s=10)  # ...until it ends
    thread.join()
    with users.use() as seen:
        with users.use():  # one that began and ended while this one ran
            pass
    assert users.others_finished_since(seen, timeout_s=0)


class RecordedBudget(ByteBudget):
    """A device-memory budget for a worker on the CPU (which has none), recording what each run reserved."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.reservations: list[int] = []

    @contextlib.contextmanager
    def reserve(self, nbytes: int) -> Iterator[None]:
        self.reservations.append(nbytes)
        with super().reserve(nbytes):
            yield


def _budgeted(evaluator: Evaluator, monkeypatch: pytest.MonkeyPatch, capacity: int) -> RecordedBudget:
    budget = RecordedBudget(capacity)
    monkeypatch.setattr(evaluator, "device_memory", lambda device: budget)
    return budget


OUT_OF_MEMORY = "raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 6.00 GiB')"


def test_children_short_of_memory_others_held_run_again_once_those_end(
    kz_env: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Children that run out of device memory while other work of the worker holds it (stood for by
    two uses this test holds, ending at two deadlines) run again once one of those ends, reserving
    twice as much: a reference short of memory until the first deadline is then run and its group
    judged; a candidate always short of it runs once more after the second, and then, alone, gets
    the shortage as its verdict. A reference short of memory alone gets the reason at once."""
    evaluator = Evaluator(kz_env(reward_warm_children=2))
    budget = _budgeted(evaluator, monkeypatch, 8 * GIB)
    # the second past the short candidate's first run even on a loaded machine (the reference runs again after the first)
    first, second = time.time() + 12, time.time() + 40
    reference = RELU_REFERENCE.replace(
        "    def forward(self, x):\n",
        f"    def forward(self, x):\n        import time\n        if time.time() < {first}:\n            {OUT_OF_MEMORY}\n",
    )

    def hold_until(deadline: float) -> None:
        with evaluator.device_users.use():
            time.sleep(max(0.0, deadline - time.time()))

    holders = [threading.Thread(target=hold_until, args=(d,)) for d in (first, second)]
    try:
        for holder in holders:
            holder.start()
        evaluation = evaluator.evaluate_group(
            reference, [CORRECT, candidate(OUT_OF_MEMORY)], ScoreOptions(device="cpu", timeout_s=120)
        )
        ended = time.time()
        correct, short = evaluation.verdicts
        assert evaluation.reference["memory_retries"] == 1 and ended > second
        assert correct.status == "correct" and "memory_retries" not in correct.details, correct.reason
        assert short.status == "runtime_error" and short.reason.startswith("out of memory while running ModelNew"), short.reason
        # once after the other candidate, if it ended while this one ran, and once after the second use
        assert short.details["out_of_memory"] and 1 <= short.details["memory_retries"] <= MEMORY_RETRIES
        runs = [correct.details["device_memory"]["reserved"]]  # the candidates' estimate: the short one's first run too
        for _ in range(short.details["memory_retries"]):
            runs.append(after_shortage(runs[-1], ceiling=4 * GIB))  # twice as much, at most half the budget
        assert runs[1] == 2 * runs[0] and short.details["device_memory"]["reserved"] == runs[-1]
        assert budget.reservations == [GIB, 2 * GIB, runs[0], *runs]
        for holder in holders:
            holder.join()

        started = time.monotonic()
        alone = evaluator.evaluate_group(
            reference.replace(str(first), str(time.time() + 600)), [CORRECT], ScoreOptions(device="cpu", timeout_s=120)
        ).verdicts[0]
        assert alone.status == "runtime_error" and "out of cpu memory: CUDA out of memory" in alone.reason, alone.reason
        assert time.monotonic() - started < 60
    finally:
        evaluator.close()


def test_a_reference_reserves_device_memory_before_it_runs(
    kz_env: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reference never run on the worker reserves an eighth of the device budget, and with other
    runs' reservations leaving less (one this test holds) it waits in its slot until they end."""
    evaluator = Evaluator(kz_env(reward_warm_children=1))
    budget = _budgeted(evaluator, monkeypatch, 8 * GIB)
    held, release = threading.Event(), threading.Event()

    def other_run() -> None:
        with budget.reserve(7 * GIB + GIB // 2):
            held.set()
            release.wait(30)

    holder = threading.Thread(target=other_run)
    results: list[Evaluation] = []
    group = threading.Thread(
        target=lambda: results.append(evaluator.evaluate_group(RELU_REFERENCE, [CORRECT], ScoreOptions(device="cpu")))
    )
    try:
        holder.start()
        assert held.wait(10)
        group.start()
        _wait_until(lambda: len(budget.reservations) == 2, timeout_s=60)
        time.sleep(1.0)
        assert budget.reservations[1] == GIB and not results  # the reference's eighth, waiting for the held bytes
        release.set()
        group.join(120)
        verdict = results[0].verdicts[0]
        assert verdict.status == "correct", verdict.reason
        assert verdict.details["seconds"]["waiting"]["reference_device_memory"] >= 1.0
        assert budget.reserved == 0
    finally:
        release.set()
        evaluator.close()


def test_what_a_reference_reserves_is_learned_from_its_last_run() -> None:
    peaks = ReferencePeaks(known=2)
    assert peaks.reservation("a", 80 * GIB) == 10 * GIB  # never run here: an eighth
    peaks.learn("a", 3 * GIB)
    assert peaks.reservation("a", 80 * GIB) == 3 * GIB + DEVICE_CONTEXT_BYTES
    peaks.learn("b", 100 * GIB)
    assert peaks.reservation("b", 80 * GIB) == 80 * GIB  # at most the budget
    peaks.learn("c", GIB)
    assert peaks.reservation("a", 80 * GIB) == 10 * GIB  # the oldest is forgotten
    peaks.learn("c", GIB // 2)
    assert peaks.reservation("c", 80 * GIB) == GIB + DEVICE_CONTEXT_BYTES  # the largest peak seen
    assert after_shortage(30 * GIB, ceiling=80 * GIB) == 60 * GIB and after_shortage(60 * GIB, ceiling=80 * GIB) == 80 * GIB
    assert after_shortage(50 * GIB, ceiling=40 * GIB) == 50 * GIB  # never less than before


def test_a_reservation_waiting_past_the_drain_time_goes_before_later_ones() -> None:
    """Capacity 10 with 6 reserved: a reservation of 8 waits. Within the drain time a later 3 fits
    beside the 6 and is made; past it a later 1 waits too (6 + 3 + 1 would fit), a slot's check turns
    it away as well, and once the running are done the 8 is made first, then the 1 beside it."""
    now = [0.0]
    budget = ByteBudget(10, drain_after_s=60, clock=lambda: now[0])
    reserved_when_made: dict[int, int] = {}
    release = {n: threading.Event() for n in (6, 8, 3, 1)}

    def run(nbytes: int) -> None:
        with budget.reserve(nbytes):
            reserved_when_made[nbytes] = budget.reserved
            release[nbytes].wait(30)

    threads = {n: threading.Thread(target=run, args=(n,), daemon=True) for n in (6, 8, 3, 1)}
    try:
        threads[6].start()
        _wait_until(lambda: 6 in reserved_when_made)
        threads[8].start()
        _wait_until(lambda: budget.waiting == 1)
        now[0] = 59.0
        assert not budget.fits(8) and budget.fits(3)
        threads[3].start()
        _wait_until(lambda: 3 in reserved_when_made)
        now[0] = 61.0  # the 8 has waited past the drain time
        assert not budget.fits(1) and budget.fits(0)
        threads[1].start()
        _wait_until(lambda: budget.waiting == 2)
        release[6].set()
        time.sleep(0.2)
        assert set(reserved_when_made) == {6, 3}  # the 1 would fit beside the 3, but the 8 goes first
        release[3].set()
        _wait_until(lambda: 1 in reserved_when_made)
        assert reserved_when_made[1] == 9  # made once the 8 was
    finally:
        for event in release.values():
            event.set()
        for thread in threads.values():
            thread.join(5)
    assert budget.reserved == 0 and budget.waiting == 0


def test_a_reservation_interrupted_while_it_waits_drains_nothing() -> None:
    """A time limit raised in a thread waiting for bytes (as for a slot, above) takes its reservation out
    of the line: it reserved nothing and turns no later one away."""
    now = [0.0]
    budget = ByteBudget(10, drain_after_s=60, clock=lambda: now[0])
    with budget.reserve(6):
        original = budget._changed.wait_for
        budget._changed.wait_for = lambda *a, **k: (_ for _ in ()).throw(TimeoutError())  # type: ignore[method-assign]
        with pytest.raises(TimeoutError), budget.reserve(8):
            pass
        budget._changed.wait_for = original  # type: ignore[method-assign]
        now[0] = 100.0
        assert budget.waiting == 0 and budget.reserved == 6 and budget.fits(4)


def test_the_slot_line_looks_again_when_asked() -> None:
    """A slot beyond its group's even share goes once its memory fits; a reservation made (the end of a
    drain) announces it, as a slot's release does."""
    slots = ChildSlots(3)
    fits = {"memory": False}
    granted = threading.Event()

    def beyond_share() -> None:
        with slots.take((0, 1), lambda: fits["memory"]):
            granted.set()

    with slots.take((0, 0)), slots.take((1, 0)):  # two groups, one slot each: a second of group 0 is beyond its share
        thread = threading.Thread(target=beyond_share, daemon=True)
        thread.start()
        _wait_until(lambda: (0, 1) in slots.waiting)
        fits["memory"] = True
        assert not granted.wait(0.3)  # nothing told the line
        slots.recheck()
        assert granted.wait(5)
    thread.join(5)


def test_the_device_budget_leaves_room_for_the_warm_childrens_contexts() -> None:
    h100 = 85_000_000_000
    assert device_budget(h100, 0) == h100 * 9 // 10
    assert device_budget(h100, 8) == h100 * 9 // 10 - 8 * DEVICE_CONTEXT_BYTES  # eight idle contexts: 8 GiB more
    assert device_budget(16 * GIB, 16) == 8 * GIB  # never below half the GPU


def test_a_child_the_oom_killer_ended_while_others_ran_runs_again(kz_env: Callable[..., Settings]) -> None:
    """On a GPU worker host memory has no limit per child, and the kernel's OOM killer ends a child
    (its first choice). One killed so while other work of the worker ran (a use this test holds)
    runs again once that work ends; one killed alone gets the reason at once. The kill is stood
    for by a SIGKILL the reference sends itself until the held use ends."""
    evaluator = Evaluator(kz_env(reward_warm_children=1))
    deadline = time.time() + 20  # past a child's start on a loaded machine
    reference = RELU_REFERENCE.replace(
        "    def forward(self, x):\n",
        f"    def forward(self, x):\n        import os, signal, time\n        if time.time() < {deadline}:\n"
        f"            os.kill(os.getpid(), signal.SIGKILL)\n",
    )
    holding = threading.Event()

    def hold() -> None:
        with evaluator.device_users.use():
            holding.set()
            time.sleep(max(0.0, deadline - time.time()))

    holder = threading.Thread(target=hold)
    try:
        holder.start()
        assert holding.wait(10)
        evaluation = evaluator.evaluate_group(reference, [CORRECT], ScoreOptions(device="cpu", timeout_s=120))
        assert time.time() > deadline and evaluation.reference["memory_retries"] == 1
        assert evaluation.verdicts[0].status == "correct", evaluation.verdicts[0].reason
        holder.join()

        alone = evaluator.evaluate_group(
            reference.replace(str(deadline), str(time.time() + 600)), [CORRECT], ScoreOptions(device="cpu", timeout_s=120)
        ).verdicts[0]
        assert alone.status == "runtime_error" and "killed by SIGKILL (likely out of memory)" in alone.reason, alone.reason
    finally:
        evaluator.close()


def test_only_a_kill_that_was_not_the_time_limit_counts_as_one_for_memory() -> None:
    killed = run_sandboxed(
        [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"], Confinement(wall_timeout_s=20)
    )
    timed_out = run_sandboxed([sys.executable, "-c", "import time; time.sleep(60)"], Confinement(wall_timeout_s=1))
    crashed = run_sandboxed([sys.executable, "-c", "import ctypes; ctypes.string_at(0)"], Confinement(wall_timeout_s=20))
    assert killed.killed_for_memory and not timed_out.killed_for_memory and not crashed.killed_for_memory


@pytest.mark.parametrize(
    "sandbox", [pytest.param("bwrap", marks=pytest.mark.skipif(bwrap_probe()[0] is None, reason="no bwrap")), "fallback"]
)
def test_closing_the_evaluator_stops_the_job_it_runs_and_starts_no_more(
    sandbox: str, kz_env: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a Ctrl-C of ``kernelzero eval`` relies on: children run in their own sessions, so only
    the pool can stop the ones a job is using (bwrap's die-with-parent follows the spawner thread;
    the fallback has nothing like it); after close no child starts, so the job ends (with an error
    or a verdict its caller throws away) instead of running its retries."""
    monkeypatch.setenv("KZ_SANDBOX", sandbox)
    evaluator = Evaluator(kz_env(reward_warm_children=0))
    reference = RELU_REFERENCE.replace(
        "    def forward(self, x):\n", "    def forward(self, x):\n        import time\n        time.sleep(300)\n"
    )
    ended = threading.Event()

    def score() -> None:
        try:
            evaluator.evaluate_group(reference, [CORRECT], ScoreOptions(device="cpu", timeout_s=600))
        except PoolClosed:
            pass
        finally:
            ended.set()

    job = threading.Thread(target=score, daemon=True)
    job.start()
    jobs = evaluator.layout.jobs
    deadline = time.monotonic() + 60
    while not any(jobs.iterdir()) and time.monotonic() < deadline:  # the reference's child has its work dir
        time.sleep(0.1)
    time.sleep(3)  # and is in its forward, asleep
    assert not ended.is_set()
    evaluator.close()
    assert ended.wait(30), "the job went on after close"
    with pytest.raises(PoolClosed):
        evaluator.pool("cpu")
    assert leftovers(evaluator.settings.data_dir, set()) == []


def test_a_new_pools_children_start_before_the_policy_check_imports_torch(
    kz_env: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The policy check imports torch and Triton to resolve names (seconds on a GPU host): a fresh
    `kernelzero score` has its children warming up meanwhile, not only once it is done."""
    import reward_svc.evaluate as evaluate

    evaluator = Evaluator(kz_env(reward_warm_children=2))
    started_at_check: list[int] = []
    check = evaluate.check_source

    def seen_by_the_check(source: str) -> list:  # type: ignore[type-arg]
        started_at_check.append(sum(len(pool._warm) for pool in evaluator._pools.values()))
        return check(source)

    monkeypatch.setattr(evaluate, "check_source", seen_by_the_check)
    try:
        refused = candidate("return launch_relu(x, torch.empty_like(x))", extra="import subprocess")
        [verdict] = evaluator.evaluate_group(RELU_REFERENCE, [refused], ScoreOptions(device="cpu")).verdicts
    finally:
        evaluator.close()
    assert verdict.status == "rejected"
    assert started_at_check == [2]


def test_auto_starts_the_pool_before_torch_says_which_device(
    kz_env: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--device auto`` (the CLI's default) asked torch first (its import: seconds on a GPU host) and
    started the children after: they now warm up while it answers, on the device NVIDIA's device
    nodes say it will answer."""
    import reward_svc.evaluate as evaluate

    evaluator = Evaluator(kz_env(reward_warm_children=2))
    started_at_resolve: list[int] = []
    resolve = evaluate.resolve_device

    def seen_when_resolved(requested: str) -> str:
        started_at_resolve.append(sum(len(pool._warm) for pool in evaluator._pools.values()))
        return resolve(requested)

    monkeypatch.setattr(evaluate, "resolve_device", seen_when_resolved)
    try:
        refused = candidate("return launch_relu(x, torch.empty_like(x))", extra="import subprocess")
        evaluation = evaluator.evaluate_group(RELU_REFERENCE, [refused], ScoreOptions(device="auto"))
    finally:
        evaluator.close()
    assert started_at_resolve == [2]
    assert list(evaluator._pools) == [evaluation.device] == [likely_device("auto")]


def test_auto_on_a_host_without_nvidia_device_nodes_is_the_cpu_without_importing_torch(tmp_path: Path) -> None:
    node = tmp_path / "nvidiactl"

    def answers(expression: str) -> list[str]:
        code = f"import sys; import services.children.device as d; d.NVIDIA_DEVICE_NODES = ({str(node)!r},); print({expression})"
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()

    assert answers("d.resolve_device('auto'), 'torch' in sys.modules") == ["cpu", "False"]
    node.touch()  # the driver's node: CUDA is likely, and torch has the last word
    assert answers("d.likely_device('auto'), d.likely_device('cpu')") == ["cuda", "cpu"]


def test_requests_with_ever_new_time_limits_start_no_further_pool(kz_env: Callable[..., Settings]) -> None:
    """One pool of warm children per device, whatever a request's time limit (each job is held to its
    own): requests with ever new limits start no further children."""
    evaluator = Evaluator(kz_env(reward_warm_children=1))
    refused = candidate("return launch_relu(x, torch.empty_like(x))", extra="import subprocess")
    try:
        for timeout_s in (30.0, 31.0, 32.0):
            [verdict] = evaluator.evaluate_group(
                RELU_REFERENCE, [refused], ScoreOptions(device="cpu", timeout_s=timeout_s)
            ).verdicts
            assert verdict.status == "rejected"
        assert list(evaluator._pools) == ["cpu"]
    finally:
        evaluator.close()


def test_a_child_taken_before_its_pool_closed_fails_its_job_as_closed(kz_env: Callable[..., Settings]) -> None:
    """A job that took its child just before the close (the pool killed it) reads as the pool's close, which
    a stopping process expects, not as a second run of the child's process."""
    evaluator = Evaluator(kz_env(reward_warm_children=1))
    child = evaluator.pool("cpu").take()
    evaluator.close()
    with pytest.raises(PoolClosed, match="closed before this child's job started"):
        child.run({"role": "reference"})
    assert leftovers(evaluator.settings.data_dir, set()) == []
