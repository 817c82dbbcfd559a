"""One evaluation: policy check, the reference child (once per group), candidate children, judge.

Plain functions over plain data, so the CLI, the Celery task and the tests call the same thing.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import itertools
import math
import os
import secrets
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from reward_svc.admission import (
    ByteBudget,
    ChildSlots,
    DeviceUsers,
    ReferencePeaks,
    after_shortage,
    candidate_device_bytes,
    device_budget,
)
from reward_svc.build_cache import BuildCache
from reward_svc.policy import check_source
from reward_svc.protocol import (
    CandidateResult,
    CandidateSpec,
    ReferenceResult,
    ReferenceSpec,
    RefusedResult,
    candidate_result,
    reference_result,
)
from reward_svc.redact import Redactor
from reward_svc.shared_builds import HARNESS_CHILD, SharedBuilds
from services.children.device import gpu_lock, likely_device, resolve_device
from services.children.layout import Layout
from services.children.pool import FORGED_RESULT, Child, ChildPool, PoolClosed
from services.config import Settings, get_settings
from services.sandbox import SandboxResult
from services.schemas.reward import ScoreOptions, Verdict

if TYPE_CHECKING:  # verify imports torch, which this module loads only where it judges
    from reward_svc.verify import GroupExpected

REPORTED_BUILDS = 8
GROUP_EXPECTED_SHARE = 8  # a group keeps its expected outputs on the device within this share of the budget
BUILD_FIELDS = frozenset({"name", "strategy", "seconds", "cache_hit", "ok"})  # of compile.CompileEntry
CHILD_WARM_UP_S = 600.0  # the most a taken child is waited for to warm up (16 at once take about 15 s on the H200 host)
MEMORY_RETRIES = 3  # runs again of a child that ran out of memory other children held (each after one of them ended)


@dataclass
class Evaluation:
    """What a group evaluation produced: one verdict per candidate, plus the reference's facts."""

    verdicts: list[Verdict]
    device: str
    reference: ReferenceResult = field(default_factory=lambda: ReferenceResult())


class Evaluator:
    """Owns the warm children of one worker; evaluates groups of candidates against a reference."""

    def __init__(self, settings: Settings | None = None, *, seeds: Callable[[str], GroupSeeds] | None = None) -> None:
        """``seeds``: a group's seeds from its reference source, for a benchmark that scores the same candidates
        twice to compare verdicts (predictable seeds let a candidate fitted to them pass: never a service's);
        by default each group draws secret ones."""
        self.settings = settings or get_settings()
        self.seeds = seeds or (lambda _reference: secret_seeds())
        self.layout = Layout(self.settings.data_dir / "reward", scratch=self.settings.reward_scratch_dir).create()
        self.builds = BuildCache(self.layout.cache, self.settings.reward_cache_max_bytes)
        self._pools: dict[str, ChildPool] = {}
        self._pools_lock = threading.Lock()  # a GPU worker evaluates several groups at once (threads)
        self._closed = False
        self.exchange_max_bytes = self.settings.reward_exchange_max_bytes or shutil.disk_usage(self.layout.exchange).total // 4
        self.exchange_budget = ByteBudget(self.exchange_max_bytes)
        self._device_memory: ByteBudget | None = None  # sized once a group runs on the GPU
        self.device_users = DeviceUsers()
        self.reference_peaks = ReferencePeaks()
        self.slots = ChildSlots(child_slots(self.settings, 0))  # children at once, across this worker's groups
        self._groups_in_flight = 0
        self._arrivals = itertools.count()  # a group's place in line for slots, among groups running as few
        self.redactor = Redactor(self.settings)
        # The judge's module imports torch (seconds): loaded beside the children's warm-up, not after the reference ran.
        threading.Thread(target=importlib.import_module, args=("reward_svc.verify",), name="import-judge", daemon=True).start()

    def pool(self, device: str) -> ChildPool:
        """The device's warm children: one pool whatever a request's time limit, which each job is given
        (a pool per limit would let requests start children by the pool-full)."""
        with self._pools_lock:
            if self._closed:
                raise PoolClosed("the evaluator is closed: its process is stopping")
            if device not in self._pools:
                self._pools[device] = ChildPool(
                    self.settings,
                    self.layout,
                    device,
                    CHILD_WARM_UP_S,
                    warm_children(self.settings, device),
                    HARNESS_CHILD,
                    SharedBuilds(self.layout, device),
                    exchange=self.settings.reward_device_exchange,
                )
            return self._pools[device]

    def device_memory(self, device: str) -> ByteBudget | None:
        """The budget of device memory children reserve on the GPU (none on the CPU)."""
        if device != "cuda":
            return None
        with self._pools_lock:
            if self._device_memory is None:
                self._device_memory = ByteBudget(
                    self.settings.reward_device_memory_max_bytes or _device_capacity(warm_children(self.settings, device))
                )
            return self._device_memory

    @contextlib.contextmanager
    def _in_flight(self) -> Iterator[None]:
        """A group counted in flight: a caller running more groups at once than the worker is sized for (the
        Coder's eval with --concurrency, tests) gets its slots for each, as a fixed number per group gave."""
        with self._pools_lock:
            self._groups_in_flight += 1
            self.slots.resize(child_slots(self.settings, self._groups_in_flight))
        try:
            yield
        finally:
            with self._pools_lock:
                self._groups_in_flight -= 1
                self.slots.resize(child_slots(self.settings, self._groups_in_flight))

    def close(self) -> None:
        """Stop every child, the ones still running a job too (that job fails): for a stopping process."""
        with self._pools_lock:
            self._closed = True
            pools = list(self._pools.values())
        for pool in pools:
            pool.close()

    def evaluate_group(self, reference: str, candidates: list[str], options: ScoreOptions) -> Evaluation:
        """One verdict per candidate, in order; every verdict bounded and with the platform's secrets
        taken out (redact.py) before it leaves."""
        with self._in_flight():
            evaluation = self._evaluate_group(reference, candidates, options)
        evaluation.verdicts = [self.redactor.verdict(v) for v in evaluation.verdicts]
        return evaluation

    def _evaluate_group(self, reference: str, candidates: list[str], options: ScoreOptions) -> Evaluation:
        # A process's first pool before the policy check and before "auto" is resolved: its children warm
        # up while this process imports torch and Triton (seconds; a fresh `kernelzero score` waited for
        # both in turn). Only the first: a request the policy refuses whole must not be a cheap way to
        # start pools.
        if not self._pools:
            self.pool(likely_device(options.device))
        arrival = next(self._arrivals)
        device = resolve_device(options.device)
        verdicts: list[Verdict | None] = [None] * len(candidates)
        for i, source in enumerate(candidates):
            verdicts[i] = _policy_verdict(source)
        pending = [i for i, v in enumerate(verdicts) if v is None]
        if not pending:
            return Evaluation([v for v in verdicts if v is not None], device)

        seeds = self.seeds(reference)
        ref_child, outcome, ref_result, reference_s, ref_waits = self._run_reference(reference, arrival, device, options, seeds)
        with contextlib.ExitStack() as group:
            group.enter_context(self.exchange_budget.hold(ref_result.get("files_bytes", 0) if ref_result else 0))
            group.callback(ref_child.discard)  # its files go before the hold on them does
            if ref_result is None or ref_result.get("status") != "ok":
                why = ref_result.get("reason") if ref_result else _crash_reason(outcome, "the reference")
                verdict = Verdict("runtime_error", f"the reference could not be evaluated: {why}", guard=None)
                return Evaluation([v or verdict for v in verdicts], device, ref_result or {})
            exchange = self.layout.exchange / ref_child.workdir.name
            (ref_child.workdir / "exchange").rename(exchange)
            group.callback(shutil.rmtree, exchange, ignore_errors=True)
            from reward_svc.verify import Tolerance  # imported since the evaluator began (above)

            tolerance = Tolerance(options.atol, options.rtol)
            group_expected = self._group_expected(group, device, ref_result)

            def run_one(i: int) -> None:
                verdict = self._evaluate_candidate(
                    candidates[i],
                    (arrival, i),
                    device,
                    options,
                    seeds,
                    exchange,
                    ref_result,
                    ref_child.workdir,
                    tolerance,
                    group_expected,
                )
                seconds = verdict.details.setdefault("seconds", {})
                seconds["reference"] = round(reference_s, 3)
                seconds.setdefault("waiting", {}).update(ref_waits)
                verdicts[i] = verdict

            # each waits for a slot (self.slots); no more threads than a group could ever have slots
            with ThreadPoolExecutor(max_workers=min(len(pending), self.slots.size)) as executor:
                list(executor.map(run_one, pending))
            return Evaluation([v for v in verdicts if v is not None], device, ref_result)

    def _group_expected(self, group: contextlib.ExitStack, device: str, ref_result: ReferenceResult) -> GroupExpected | None:
        """With the device exchange, a GPU group whose outputs the judge compares on the device keeps its expected
        outputs there for its candidates' judges (``GroupExpected``), where they take at most an eighth of the
        device-memory budget. Their bytes are held against it for the group's life as a reference's files are
        held against the scratch budget: counted before a new reference starts, never waited on by a candidate,
        its own group's included (a reservation its own candidates had to fit beside could wait forever)."""
        from reward_svc.verify import HOST_JUDGE_MAX_BYTES, GroupExpected

        output_bytes = ref_result.get("output_bytes", 0)
        group_bytes = ref_result["cases"] * output_bytes
        device_memory = self.device_memory(device)
        on_device = output_bytes >= self.settings.reward_device_exchange_min_bytes or output_bytes > HOST_JUDGE_MAX_BYTES
        if not self.settings.reward_device_exchange or device_memory is None or not on_device:
            return None
        if group_bytes > device_memory.capacity // GROUP_EXPECTED_SHARE:
            return None
        group.enter_context(device_memory.hold(group_bytes))
        group_expected = GroupExpected(device)
        group.callback(_release_device_memory, device)
        group.callback(group_expected.close)  # before the hold goes (the stack unwinds last in, first out)
        return group_expected

    def _room_for_a_reference(self, device_memory: ByteBudget | None) -> bool:
        """Whether a new reference may start now: the scratch dir has room for its files and the device
        (where it is budgeted) for its memory."""
        return self.exchange_budget.has_room() and (device_memory is None or device_memory.has_room())

    def _run_reference(
        self, reference: str, arrival: int, device: str, options: ScoreOptions, seeds: GroupSeeds
    ) -> tuple[Child, SandboxResult, ReferenceResult | None, float, dict[str, float]]:
        """The reference child, run again while the scratch filesystem has no room for its files yet,
        or after it ran out of device memory that other children held; (child, outcome, result,
        seconds, waits) of its last run. It runs in a slot, ahead of its group's candidates, after the
        waits for room (a slot waiting for room would idle), with its device memory reserved."""
        memory_retries = 0
        device_memory = self.device_memory(device)
        device_bytes = 0 if device_memory is None else self.reference_peaks.reservation(reference, device_memory.capacity)
        first_started = time.perf_counter()
        while True:
            started = time.perf_counter()
            self.exchange_budget.wait_for_room()  # heavy groups queue here rather than fill the scratch dir together
            if device_memory is not None:  # what groups hold counts here, never in a slot (the slot's wait must end)
                device_memory.wait_for_room()
            admitted = time.perf_counter()
            # no memory check in line: a reference's group runs nothing yet, so its slot is within its even share
            with self.slots.take((arrival, -1)), contextlib.ExitStack() as reservation:
                if not self._room_for_a_reference(device_memory):
                    continue  # others took the room while it waited in line: the slot goes back, it waits for room again
                slotted = time.perf_counter()
                if device_memory is not None:
                    reservation.enter_context(device_memory.reserve(device_bytes))
                    self.slots.recheck()
                reserved = time.perf_counter()
                ref_child = self.pool(device).take()
                ref_waits = {
                    "reference_admission": round(admitted - started, 3),
                    "reference_slot": round(slotted - admitted, 3),
                    "reference_device_memory": round(reserved - slotted, 3),
                    "reference_child": round(time.perf_counter() - reserved, 3),
                    "reference_retries": round(started - first_started, 3),  # runs that found no room or memory, and their waits
                }
                (ref_child.workdir / "reference.py").write_text(reference)
                ref_spec: ReferenceSpec = {
                    "role": "reference",
                    "reference_path": str(ref_child.workdir / "reference.py"),
                    "device": device,
                    "trials": options.trials,
                    "input_seed": seeds["input"],
                    "weight_seeds": seeds["weights"],
                    "time": options.measure_speed and device == "cuda",
                    "time_compiled": options.time_compiled,
                    "timing_budget_s": options.timing_budget_s,
                    "exchange_max_bytes": self.exchange_max_bytes,
                    "atol": options.atol,
                    "rtol": options.rtol,
                    "scratch_min_free_bytes": self.settings.reward_scratch_min_free_bytes,
                }
                started = time.perf_counter()
                with self.device_users.use() as seen:
                    outcome, answer = ref_child.run(ref_spec, wall_timeout_s=options.timeout_s)
            ref_result = None if answer is None else _checked_reference(answer, options.trials)
            reference_s = time.perf_counter() - started
            # a child the OOM killer ended is short of memory like one that ran out of device memory
            status = ref_result.get("status") if ref_result else ("out_of_memory" if outcome.killed_for_memory else None)
            if status == "no_room":
                wait = functools.partial(self.exchange_budget.wait_for_release, options.timeout_s)
            elif status == "out_of_memory" and memory_retries < MEMORY_RETRIES:
                memory_retries += 1
                if device_memory is not None:
                    device_bytes = after_shortage(device_bytes, ceiling=device_memory.capacity)
                wait = functools.partial(self.device_users.others_finished_since, seen, options.timeout_s)
            else:
                if ref_result is not None and memory_retries:
                    ref_result["memory_retries"] = memory_retries
                if ref_result is not None and status == "ok" and isinstance(ref_result.get("device_peak_bytes"), int):
                    self.reference_peaks.learn(reference, ref_result["device_peak_bytes"])
                return ref_child, outcome, ref_result, reference_s, ref_waits
            ref_child.discard()  # its files and device memory go before the wait
            if not wait():  # nothing of ours will free what it lacks: its own reason becomes the group's verdict
                return ref_child, outcome, ref_result, reference_s, ref_waits

    def _evaluate_candidate(
        self,
        source: str,
        place: tuple[int, int],
        device: str,
        options: ScoreOptions,
        seeds: GroupSeeds,
        exchange: Path,
        ref_result: ReferenceResult,
        ref_dir: Path,
        tolerance: Any,
        group_expected: GroupExpected | None = None,
    ) -> Verdict:
        cases = ref_result["cases"]
        # the trials (one of them the knockout), the refresh, the recall and, where it is timed, the last timed call
        outputs = cases + 2 + (options.measure_speed and device == "cuda")
        # judged as they come (OutputStream): those waiting for the judge, and the one being written
        at_once = min(outputs, self.settings.reward_outputs_in_flight + 1)
        device_memory = self.device_memory(device)
        device_bytes = candidate_device_bytes(
            ref_result.get("device_peak_bytes", 0),
            ref_result.get("input_bytes", 0),
            ref_result.get("output_bytes", 0),
            judged_at_once=self.settings.reward_outputs_in_flight,
        )
        first_started = time.perf_counter()
        for attempt in range(MEMORY_RETRIES + 1):
            started = time.perf_counter()
            with contextlib.ExitStack() as reservations:
                # the slot first: a candidate waiting in line reserves no bytes other groups' candidates could use
                fits = None if device_memory is None else functools.partial(device_memory.fits, device_bytes)
                reservations.enter_context(self.slots.take(place, fits))
                slotted = time.perf_counter()
                reservations.enter_context(self.exchange_budget.reserve(at_once * ref_result.get("output_bytes", 0)))
                admitted = time.perf_counter()
                if device_memory is not None:
                    reservations.enter_context(device_memory.reserve(device_bytes))
                    self.slots.recheck()
                reserved = time.perf_counter()
                child = self.pool(device).take()
                waits = {
                    "slot": round(slotted - started, 3),
                    "admission": round(admitted - slotted, 3),
                    "device_memory": round(reserved - admitted, 3),
                    "child": round(time.perf_counter() - reserved, 3),
                    "retries": round(started - first_started, 3),  # runs that ran out of device memory, and their waits
                }
                with self.device_users.use() as seen:
                    verdict = self._run_candidate(
                        child, source, device, options, seeds, exchange, ref_result, ref_dir, tolerance, group_expected
                    )
            if (
                not verdict.details.get("out_of_memory")
                or attempt == MEMORY_RETRIES
                or not self.device_users.others_finished_since(seen, options.timeout_s)
            ):
                break
            if device_memory is not None:
                device_bytes = after_shortage(device_bytes, ceiling=device_memory.capacity // 2)
        verdict.details.setdefault("seconds", {})["waiting"] = waits
        if device_memory is not None:  # the estimate beside what the child said it used (untrusted: a figure only)
            verdict.details["device_memory"] = {"reserved": device_bytes, "peak": verdict.details.pop("device_peak_bytes", None)}
        if attempt:
            verdict.details["memory_retries"] = attempt
        return verdict

    def _run_candidate(
        self,
        child: Child,
        source: str,
        device: str,
        options: ScoreOptions,
        seeds: GroupSeeds,
        exchange: Path,
        ref_result: ReferenceResult,
        ref_dir: Path,
        tolerance: Any,
        group_expected: GroupExpected | None = None,
    ) -> Verdict:
        from reward_svc.verify import FileComparer, OutputStream, TrialFiles, case_allowances, judge

        try:
            cached = self.builds.lookup(source)
            child.receive(exchange=exchange, build=cached)  # its group's inputs and its source's build, read-only
            build = child.build_inbox if cached and child.build_inbox else child.workdir / "build"
            (child.workdir / "candidate.py").write_text(source)
            fingerprint_key = secrets.randbits(62)  # the judge's check that each output file is what its trial returned
            knockout_case, copies_are_work = (
                knockout_at(ref_result, seeds["knockout"] % ref_result["cases"])
                if "knockout" in seeds
                else choose_knockout_case(ref_result)
            )
            spec: CandidateSpec = {
                "role": "candidate",
                "candidate_path": str(child.workdir / "candidate.py"),
                "backend": options.backend,
                "device": device,
                "trials": ref_result["cases"],
                "weight_seeds": seeds["weights"],
                "exchange_dir": str(child.inbox),
                "compile_cache": str(build),
                "compile_cache_readonly": cached is not None,
                "time": options.measure_speed and device == "cuda",
                "timing_budget_s": options.timing_budget_s,
                "fingerprint_key": fingerprint_key,
                "outputs_in_flight": self.settings.reward_outputs_in_flight,
                "knockout_case": knockout_case,
                "copies_are_work": copies_are_work,
            }
            if self.settings.reward_device_exchange:
                spec["device_exchange_min_bytes"] = self.settings.reward_device_exchange_min_bytes
            lock = functools.partial(gpu_lock, self.layout.gpu_lock(device))
            compare_files = FileComparer(tolerance, device, lock, key=fingerprint_key, group_expected=group_expected)
            files = TrialFiles(child.workdir, ref_dir, ref_result["cases"], case_allowances(ref_result), knockout_case)
            started = time.perf_counter()
            sent = child.exchange if "device_exchange_min_bytes" in spec else None  # outputs on the device: on its socket
            with OutputStream(compare_files, files, at_once=self.settings.reward_outputs_in_flight, exchange=sent):
                outcome, answer = child.run(spec, wall_timeout_s=options.timeout_s)
            result = None if answer is None else _checked_candidate(answer)
            candidate_s = time.perf_counter() - started
            if result is None:
                details: dict[str, Any] = {"stderr_tail": outcome.stderr[-2000:].decode(errors="replace")}
                if outcome.killed_for_memory:
                    details["out_of_memory"] = True
                return Verdict(
                    "timeout" if outcome.timed_out else "runtime_error", _crash_reason(outcome, "the candidate"), details=details
                )
            started = time.perf_counter()
            compare_files.expect(result.get("output_fingerprints"))
            verdict = judge(
                ref_result, result, files, compare_files, audit=[line for line in child.audit.splitlines() if line.strip()]
            )
            verdict.details["outputs_on_device"] = compare_files.sent  # judged without a file (device_exchange)
            if result.get("device_exchange_fallback"):  # the child's word: diagnostics, cut short
                verdict.details["device_exchange_fallback"] = str(result["device_exchange_fallback"])[:200]
            del compare_files  # its expected outputs, before the device memory goes back
            if ref_result["cases"] < options.trials:
                verdict.details["trials_cut"] = (
                    f"{ref_result['cases']} of {options.trials} correctness trials: one trial's tensors "
                    f"exceed the exchange budget (KZ_REWARD_EXCHANGE_MAX_BYTES) otherwise"
                )
            _release_device_memory(device)
            verdict.details["seconds"] = {"candidate": round(candidate_s, 3), "judge": round(time.perf_counter() - started, 3)}
            verdict.details["phases"] = {
                "reference": ref_result.get("phases"),
                "candidate": result.get("phases"),
                "candidate_trials": result.get("trial_holds"),  # its trials phase by what ran in the holds
            }
            if cached is None and build.exists() and verdict.status in ("correct", "incorrect"):
                self.builds.publish(build, source)  # a clean run's artefacts only (build_cache.py)
            verdict.details["compile_cache_hit"] = cached is not None
            if result.get("builds"):
                verdict.details["builds"] = reported_builds(result["builds"])
            if isinstance(result.get("device_peak_bytes"), int):
                verdict.details["device_peak_bytes"] = result["device_peak_bytes"]
            verdict.details["isolation"] = outcome.isolation
            return verdict
        finally:
            child.discard()


def _checked_candidate(answer: dict[str, Any]) -> CandidateResult:
    """The candidate child's result as its contract has it; one the contract refuses is that candidate's runtime
    error (the judge and the verdict's redaction rely on the contract's types)."""
    try:
        return candidate_result(answer)
    except RefusedResult as refused:
        return {"status": "runtime_error", "reason": f"the candidate's harness wrote a result the schema refuses: {refused}"}


def _checked_reference(answer: dict[str, Any], trials: int) -> ReferenceResult:
    """The reference child's result as its contract has it; one the contract refuses is the reference's runtime
    error, which every candidate of its group gets."""
    if answer == FORGED_RESULT:  # the pool's stand-in for a result its harness did not sign: say so
        return {"status": "runtime_error", "reason": f"the reference's {FORGED_RESULT['reason'].removeprefix('the ')}"}
    try:
        return reference_result(answer, trials)
    except RefusedResult as refused:
        return {"status": "runtime_error", "reason": f"the reference's harness wrote a result the schema refuses: {refused}"}


def reported_builds(reported: object) -> list[dict[str, Any]]:
    """What a candidate's child says of its load_inline calls (header tiers, seconds): diagnostics, never
    trusted, so only the first few and their plain fields reach the verdict."""
    entries = reported[:REPORTED_BUILDS] if isinstance(reported, list) else []
    return [{k: v for k, v in entry.items() if k in BUILD_FIELDS and _plain(v)} for entry in entries if isinstance(entry, dict)]


def _plain(value: object) -> bool:
    """A short string, a bool or a finite number (a child's JSON may carry NaN or Infinity)."""
    if isinstance(value, str):
        return len(value) <= 300
    return isinstance(value, bool | int) or isinstance(value, float) and math.isfinite(value)


def _release_device_memory(device: str) -> None:
    """The judge's tensors go back to the device, not to this worker's allocator cache."""
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()


def _device_capacity(idle_children: int) -> int:
    import torch

    return device_budget(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory, idle_children)


def child_slots(settings: Settings, groups_in_flight: int) -> int:
    """Evaluation children a worker process runs at once: ``reward_parallel_children`` for each group it
    is sized to run at once (a GPU worker's Celery threads, ``reward_gpu_concurrency``; a CPU worker's
    process runs one: services/cli/launcher.py), or for each group in flight where there are more."""
    sized_for = settings.reward_gpu_concurrency if settings.gpu_devices else 1
    return settings.reward_parallel_children * max(sized_for, groups_in_flight)


def warm_children(settings: Settings, device: str) -> int:
    if settings.reward_warm_children is not None:
        return settings.reward_warm_children
    return 1 if device == "cpu" else min(8, max(2, (os.cpu_count() or 2) // 2))


def _policy_verdict(source: str) -> Verdict | None:
    try:
        violations = check_source(source)
    except SyntaxError as exc:
        return Verdict("compile_error", f"the candidate is not valid Python: {exc.msg} (line {exc.lineno})")
    if not violations:
        return None
    first = violations[0]
    return Verdict(
        "rejected",
        f"{first.guard}: {first.describe()}",
        guard=first.guard,
        details={"violations": [v.describe() for v in violations]},
    )


class GroupSeeds(TypedDict):
    input: int
    weights: list[int]  # two distinct seeds, each case's model built with one
    knockout: NotRequired[int]  # every candidate's knockout case, modulo the cases (replayable runs); else a secret pick each


def secret_seeds() -> GroupSeeds:
    """Per request: inputs and weights no candidate can predict; two weight seeds, so a candidate
    that ignores the weights it was given cannot pass."""
    weights = secrets.randbelow(2**31 - 1)
    return {"input": secrets.randbelow(2**31 - 1), "weights": [weights, (weights + 1 + secrets.randbelow(2**30)) % (2**31 - 1)]}


def choose_knockout_case(ref_result: ReferenceResult) -> tuple[int, bool]:
    """(the case a candidate runs knocked out the first time it sees its values, whether copies are
    poisoned there): a secret pick per candidate among all the cases, so no trial is one a forward
    could know is not the knockout. Where a reference op acts as a copy on the picked case's values
    (a clamp whose bounds do not bind there), an honest kernel of it is a copy, so copies are poisoned
    like any write there, and the op accounting stands behind laundering through a copy kernel."""
    return knockout_at(ref_result, secrets.randbelow(ref_result["cases"]))


def knockout_at(ref_result: ReferenceResult, case: int) -> tuple[int, bool]:
    """(``case``, whether a reference op acts as a copy on its values, so the knockout poisons copies)."""
    copying = ref_result.get("copying_per_case") or []
    return case, bool(copying[case]) if case < len(copying) else False


def _crash_reason(outcome: SandboxResult, who: str) -> str:
    if outcome.timed_out:
        return f"{who} ran past the {outcome.wall_s:.0f} s time limit and was killed"
    if outcome.signal is not None:
        name = signal.Signals(outcome.signal).name if outcome.signal in signal.valid_signals() else str(outcome.signal)
        return f"{who} crashed: {outcome.describe()} ({name})"
    tail = outcome.stderr.decode(errors="replace").strip().splitlines()[-3:]
    return f"{who} exited without a result ({outcome.describe()}): {' | '.join(tail)}"


def evaluate(reference: str, candidate: str, options: ScoreOptions, evaluator: Evaluator | None = None) -> Verdict:
    evaluator = evaluator or Evaluator()
    return evaluator.evaluate_group(reference, [candidate], options).verdicts[0]
