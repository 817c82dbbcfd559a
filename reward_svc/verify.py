"""The judge: turns the two children's files and observations into one verdict.

Runs in the worker, on data only (tensors loaded with ``weights_only``); no candidate code. On a
GPU host the tensors are compared on the device: GB-sized outputs cost milliseconds there.
Order matters: a candidate is first held to the dynamic guards (did a custom kernel run, did its
result reach the output, did it tamper), then to correctness on every trial.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, cast

import structlog
import torch

from reward_svc.protocol import KNOCKOUTS, CandidateResult, KnockoutObservations, Observations, ReferenceResult
from services.children import device_exchange, tensors
from services.children.device import context_lost
from services.children.device_exchange import MAX_SENT_DIMS, MAX_SENT_TENSORS, SENT_DTYPES, Received
from services.children.report import OversizedFile, open_regular
from services.children.timing import Timing
from services.queue import unfit
from services.schemas.reward import GUARDS, Guard, Verdict

log = structlog.get_logger(__name__)

# A correct output must reproduce the reference's variation, not just its level: relative L2
# error of the mean-centred output. Applied where a constant or zero output would pass allclose.
STRUCTURE_TOLERANCE = 0.05
NOISE_ULPS = 4
SUMMING_FAMILIES = frozenset({"reduction", "contraction"})  # work whose values are sums of many terms
NOISE_SPREAD = 4  # times the reference's measured rounding noise: two roundings differ by ~1.4x it, plus margin
# PyTorch "does the reference's work" when, in some call, its compute ops of every family the
# reference's ops belong to (contraction, reduction, pointwise, data) process at least this share of
# the elements the reference's ops of that family process; its compute work beyond the reference's in
# any family (``_spill``) counts toward each of the reference's compute families. Index bookkeeping (what
# PyTorch computes from ``arange`` and its kin alone) is no work. The kernels' part is then at most the
# rest: a quarter, as the kernel share below.
FALLBACK_WORK_SHARE = 0.75
COMPUTE_FAMILIES = ("contraction", "reduction", "pointwise")
# The custom kernels must produce at least this share of the output: the elements the knockout
# (their writes poisoned) changes, among those not at a saturated value (the output's minimum or
# maximum: a ReLU or clamp after the kernel maps poison there too; within atol of 0: so does an
# underflowing softmax). Most of it, not half: a kernel
# for every other row and PyTorch for the rest is PyTorch's half-answer.
MIN_KERNEL_SHARE = 0.75
HOST_BYTES_MAX = 1024  # bytes one forward may read into Python (.item(), float(t)): shapes and constants, not the answer
# Timing faster than moving the problem's input and output bytes once at this share of the bandwidth
# the reference's harness measured (its L2 flush) is not believed: speed is not paid, and the verdict says why.
PLAUSIBLE_BANDWIDTH_SHARE = 2.0
# Outputs up to this size are judged on the host: milliseconds there, and no wait for the device lock
# (behind a queued timing, seconds on a busy GPU worker) for a comparison the device cannot speed up.
HOST_JUDGE_MAX_BYTES = 64 << 20
# An output file may exceed its expected output's file by this much (the archive's own records) before it
# is refused unread: the judge reads a file into its own memory, and an answer is the reference's size.
OUTPUT_SLACK_BYTES = 1 << 20


# What a candidate's harness may report (harness/candidate.py): "ok" goes on to the judge; the others
# are verdicts the harness reached (a rejection names its guard). "correct" is never among them.
CHILD_STATUSES = frozenset({"ok", "rejected", "runtime_error", "compile_error", "unverified", "timeout"})


class Comparison(NamedTuple):
    ok: bool
    why: str  # why not
    error: float  # max abs error
    mismatched: float | None = None  # share of the informative elements outside tolerance (None: none to count)


class Allowance(NamedTuple):
    """What one case's comparison allows beyond the tolerance.

    ``noise``: per output tensor, the reference's own rounding noise (L2), where it measured one.
    ``sums_cancel``: the case's inputs are a hidden distribution's (signed, wide) and the reference
    sums terms (reduction or contraction work): a value near 0 is then a difference of large terms,
    rounded at their scale, not at its own, so the absolute tolerance is taken relative to the
    output's typical magnitude (``atol·median|ref|`` when that is larger: half the values are at
    least that large, so an exp's few huge values cannot raise it). A reference that only maps values
    one by one rounds each at its own scale and gets none: a ReLU skipped before an exp would hide
    under it. The knockout's share still counts the values between atol and the allowance;
    ``get_inputs()``'s own case is held to the tolerance as it is."""

    noise: list[float] | None = None
    sums_cancel: bool = False


@dataclass(frozen=True)
class Tolerance:
    atol: float | None = None
    rtol: float | None = None

    def for_dtype(self, dtype: torch.dtype) -> tuple[float, float]:
        default = tensors.default_tolerance(dtype)
        return (self.atol if self.atol is not None else default, self.rtol if self.rtol is not None else default)


def _load_output(path: Path, max_bytes: int, *, private: bool) -> Any:
    """An output file as tensors, read only if it is a regular file of at most ``max_bytes``
    (``report.open_regular``). ``private``: copied from the checked descriptor into a file only this
    process holds (the child may still run and could swap the file, rewrite it or cut it short under a
    mapping of it), then mapped; otherwise the child is gone and its file is mapped."""
    fd = open_regular(path, max_bytes)
    try:
        if not private:  # the checked file itself, not whatever the path names by the time torch opens it
            return tensors.load(Path(f"/proc/self/fd/{fd}"))
        with _private_copy(fd, max_bytes, path) as copy:
            return tensors.load(copy)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _private_copy(fd: int, max_bytes: int, path: Path) -> Iterator[Path]:
    """The bytes behind ``fd`` in an anonymous in-memory file (``memfd``), copied by the kernel: a
    mapping of it cannot change or shrink under the judge. Once mapped it outlives its descriptor. Against
    reading the bytes into Python and deserialising them from there, one copy instead of two (a GB-sized
    output: ``benchmarks/judge_compare.py --load``)."""
    copy = os.memfd_create("kz-output", os.MFD_CLOEXEC)
    try:
        copied = 0
        while copied <= max_bytes:
            sent = os.sendfile(copy, fd, copied, max_bytes + 1 - copied)
            if not sent:
                break
            copied += sent
        if copied > max_bytes:  # it grew after the check
            raise OversizedFile(path, copied)
        yield Path(f"/proc/self/fd/{copy}")
    finally:
        os.close(copy)


class Claimed(NamedTuple):
    """A tensor as a device exchange message describes it: plain integers and a dtype, nothing allocated."""

    shape: torch.Size
    dtype: torch.dtype


def _claimed(described: Any) -> list[Claimed] | None:
    """The tensors a device exchange message describes, or None where it is not a non-empty list of plain
    descriptions (dtypes among ``device_exchange.SENT_DTYPES``, shapes of at most 16 sizes below 2**48)."""
    if not isinstance(described, dict) or not isinstance(described.get("tensors"), list):
        return None
    if not 0 < len(described["tensors"]) <= MAX_SENT_TENSORS:
        return None
    claimed: list[Claimed] = []
    for entry in described["tensors"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("shape"), list):
            return None
        if not isinstance(entry.get("dtype"), str) or entry["dtype"] not in SENT_DTYPES:
            return None
        shape = entry["shape"]
        if len(shape) > MAX_SENT_DIMS or not all(type(n) is int and 0 <= n < 1 << 48 for n in shape):
            return None
        claimed.append(Claimed(torch.Size(shape), SENT_DTYPES[entry["dtype"]]))
    return claimed


class EarlyVerdict(Exception):
    """A comparison that ends the judging with a verdict of its own: an output file that is not what
    its trial returned, or one that cannot be compared at all."""

    def __init__(self, verdict: Verdict) -> None:
        super().__init__(verdict.reason)
        self.verdict = verdict


Judged = tuple[list[int] | None, Comparison | EarlyVerdict]  # (fingerprint of the bytes judged, what judging them gave)


class GroupExpected:
    """A group's expected outputs on the device, each copied there once, when a comparison first needs it,
    for every candidate's judge: a GB-sized expected output copied from its mapped file took 1.3-1.7 s on
    the H200 host, once per output judged. The group holds their bytes against the device-memory budget for
    its life and lets them go at its end (``close``)."""

    def __init__(self, device: str) -> None:
        self.device = device
        self._guard = threading.Lock()
        self._loading: dict[Path, threading.Lock] = {}  # one per output: a judge waits only for the copy it needs
        self._loaded: dict[Path, Any] = {}

    def get(self, path: Path) -> Any:
        with self._guard:
            loading = self._loading.setdefault(path, threading.Lock())
        with loading:
            with self._guard:
                if path in self._loaded:
                    return self._loaded[path]
            loaded = tensors.load(path, self.device)
            with self._guard:
                self._loaded[path] = loaded
            return loaded

    def close(self) -> None:
        with self._guard:
            self._loaded.clear()


class FileComparer:
    """Compares an output file with its expected file where the judge runs. Files the child can no
    longer touch are memory-mapped (in the scratch dir, a tmpfs on GPU hosts, a mapped GiB is paged in
    far faster than ``torch.load`` copies it); on a GPU the outputs above ``HOST_JUDGE_MAX_BYTES``
    are copied to the device and only the arithmetic holds ``lock`` (smaller ones are compared on the
    host). The first expected output
    stays mapped (the refresh and knockout trials mostly compare against case 0 again), beside the latest
    one; on the device a comparison holds only its own two outputs (a level-1 output is 6.4 GB),
    and one the device has no room for is compared on the host.

    Under ``key`` each output must still be the bytes the candidate's harness fingerprinted when its
    trial ended (``fingerprints``, reported once the child is done): candidate code that ran after
    a trial (the next one, timing) may have rewritten its file. An output judged while the child
    still ran (``consume``) is held to the fingerprint of the bytes that were judged."""

    def __init__(
        self,
        tolerance: Tolerance,
        device: str = "cpu",
        lock: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext,
        fingerprints: dict[str, list[int]] | None = None,
        key: int | None = None,
        group_expected: GroupExpected | None = None,
    ) -> None:
        self.tolerance, self.device, self.lock = tolerance, device, lock
        self.key, self.group_expected = key, group_expected
        self.expect(fingerprints)
        self._loaded: dict[Path, Any] = {}
        self._loading = threading.Lock()  # an OutputStream may judge several outputs at once
        self._judged: dict[str, Judged] = {}
        self.sent = 0  # outputs that came on the device exchange

    def expect(self, fingerprints: dict[str, list[int]] | None) -> None:
        """The fingerprints the candidate's harness reported (read from the child's result: untrusted)."""
        self.fingerprints = fingerprints if isinstance(fingerprints, dict) else {}

    def produced(self, output: Path) -> bool:
        """Whether the trial behind ``output`` ran: its harness says so where it fingerprints (a file
        deleted later must not pass for a trial that never ran), else the file's presence."""
        return output.stem in self.fingerprints if self.key is not None else output.exists()

    def consume(self, output: Path, expected: Path, allowance: Allowance | None = None) -> None:
        """Judge ``output`` now, while the child may still run, and let its file go. The file is
        copied into memory of this process's own first (``_private_copy``), never mapped as it is:
        through a mapping of it, the child could change the bytes between the fingerprint and the
        comparison, or cut the file short under the reader (SIGBUS, the worker's death)."""
        self._judged[output.stem] = self._judge_file(output, expected, allowance, private=True)
        with contextlib.suppress(OSError):  # a directory planted under the name: left, and judged in place
            output.unlink(missing_ok=True)

    def consume_sent(self, name: str, received: Received, expected: Path, allowance: Allowance | None) -> None:
        """Judge an output the child sent on the device (``device_exchange``): the message describes its
        tensors' dtypes and shapes (untrusted), its descriptors are their memory. Only a description that is
        the expected output's tensors in number, dtype and shape is mapped at all, for exactly their bytes,
        and cloned into the judge's own memory before it is fingerprinted and compared (the child may still
        write to its copy), then held to the harness's fingerprint as a file is. Any other description ends
        the judging, as a file that cannot be compared does: an outcome the judge never read the bytes of
        cannot be held to a fingerprint, so it can never count for the candidate (a knockout that reads as
        "wrong")."""
        try:
            judged = self._judge_sent(name, received, expected, allowance)
        finally:
            received.close()
        with self._loading:
            self._judged[name] = judged
            self.sent += 1

    def _judge_sent(self, name: str, received: Received, expected: Path, allowance: Allowance | None) -> Judged:
        if received.truncated and len(received.fds) == MAX_SENT_TENSORS:  # more than any honest message carries
            return None, EarlyVerdict(
                Verdict("rejected", f"{name} came with more descriptors than tensors", guard="output_tampering")
            )
        if received.truncated:  # fewer than asked for: this worker's descriptor limit, not the candidate's doing
            return None, EarlyVerdict(
                Verdict(
                    "runtime_error",
                    f"not judged: the worker had no room for the descriptors of {name}",
                    details={"out_of_memory": True},
                )
            )
        refs = tensors.tensors_in(self._expected(expected))
        try:
            claimed = _claimed(received.message)
        except Exception:  # whatever else the untrusted message makes the reading of it raise: the message's fault
            claimed = None
        if claimed is None or len(received.fds) != len(claimed):
            malformed = f"the device exchange message for {name} is malformed or lacks its memory"
            return None, EarlyVerdict(Verdict("rejected", malformed, guard="output_tampering"))
        differs = _kinds_differ(claimed, refs)
        if differs is not None:  # what comparing the same file would say, without a byte of it mapped
            return None, EarlyVerdict(Verdict("incorrect", f"{name}: {differs.why}"))
        device = torch.device(self.device).index or 0
        out: Any = None
        for to_host in (False, True):  # a clone the device has no room for is made in host memory
            try:
                with contextlib.nullcontext() if to_host else self.lock():  # a clone on the device is device work
                    out = [
                        device_exchange.import_clone(fd, r.dtype, list(r.shape), device, to_host=to_host)
                        for fd, r in zip(received.fds, refs)
                    ]
                break
            except torch.OutOfMemoryError:
                continue
            except device_exchange.DeviceExchangeError as exc:
                if exc.error == device_exchange.OUT_OF_MEMORY:
                    return None, _out_of_memory(self.device, name)
                if exc.senders_fault:
                    unreadable = f"the device memory sent for {name} cannot be read: {exc}"[:500]
                    return None, EarlyVerdict(Verdict("rejected", unreadable, guard="output_tampering"))
                return None, _not_read(self.device, name, exc)
            except Exception as exc:  # memory the driver mapped and torch cannot use: this output's verdict, not the group's
                return None, _not_read(self.device, name, exc)
        received.close()  # the sender's memory, no longer needed once cloned
        if out is None:
            return None, _out_of_memory(self.device, name)
        judged_on = "cpu" if out[0].device.type == "cpu" else self.device
        return self._compare_here_or_on_host(judged_on, name, out if len(out) > 1 else out[0], expected, allowance)

    def __call__(self, output: Path, expected: Path, allowance: Allowance | None = None) -> Comparison:
        seen, outcome = self._judged.get(output.stem) or self._judge_file(output, expected, allowance)
        if seen is not None:
            self._check_fingerprint(output.stem, seen)
        if isinstance(outcome, EarlyVerdict):
            raise outcome
        return outcome

    def _judge_file(self, output: Path, expected: Path, allowance: Allowance | None, *, private: bool = False) -> Judged:
        """(the fingerprint of the bytes judged, where they loaded; the comparison or the verdict it ends in).
        The file is opened without following a link and without blocking (a FIFO planted under its name
        would hang ``torch.load``), must be a regular file no larger than its expected output's (plus
        ``OUTPUT_SLACK_BYTES``) before a byte of it is read."""
        try:
            out = _load_output(output, expected.stat().st_size + OUTPUT_SLACK_BYTES, private=private)
        except OversizedFile as oversized:
            return None, EarlyVerdict(
                Verdict(
                    "incorrect",
                    f"{output.stem} is {oversized.size} bytes, where the reference's "
                    f"output is {expected.stat().st_size}: not read",
                )
            )
        except Exception as exc:  # a missing or corrupt file is the candidate's verdict, not the worker's crash
            return None, EarlyVerdict(
                Verdict(
                    "rejected",
                    f"the output file of {output.stem} is missing or unreadable ({type(exc).__name__}) though its trial wrote it",
                    guard="output_tampering",
                )
            )
        on_device = self.device != "cpu" and expected.stat().st_size > HOST_JUDGE_MAX_BYTES  # the same choice for every trial
        return self._compare_here_or_on_host(self.device if on_device else "cpu", output.stem, out, expected, allowance)

    def _expected(self, path: Path) -> Any:
        with self._loading:
            if path not in self._loaded:
                self._loaded = dict(list(self._loaded.items())[:1])  # keep the first, let the latest go
                self._loaded[path] = tensors.load(path)
            return self._loaded[path]

    def _expected_on(self, device: str, path: Path) -> Any:
        """The expected output at ``path`` where a comparison on ``device`` needs it: on a GPU, the group's
        copy there where it keeps one (``GroupExpected``), else a copy of this judge's own."""
        if device == "cpu":
            return self._expected(path)
        if self.group_expected is not None:
            return self.group_expected.get(path)
        return tensors.to_device(self._expected(path), device)

    def _compare_here_or_on_host(self, device: str, name: str, out: Any, expected: Path, allowance: Allowance | None) -> Judged:
        """Compared on ``device``, or on the host where that is the host or the device has no room."""
        if device != "cpu":
            judged = self._compare_on(device, name, out, expected, allowance)
            if not (isinstance(judged[1], EarlyVerdict) and judged[1].verdict.details.get("out_of_memory")):
                return judged
        return self._compare_on("cpu", name, out, expected, allowance)

    def _compare_on(self, device: str, name: str, out: Any, expected_path: Path, allowance: Allowance | None) -> Judged:
        seen = None
        try:
            expected = self._expected_on(device, expected_path)
            differs = _kinds_differ(tensors.tensors_in(out), tensors.tensors_in(expected))
            if differs is not None and tensors.nbytes(out) > expected_path.stat().st_size + OUTPUT_SLACK_BYTES:
                # Its tensors share storages past what its file could hold: copying and fingerprinting each would
                # cost the judge what the file never held (N full-size views of one storage: N times). Not the
                # reference's tensors, no value of it is compared anyway: it ends here, as one sent on the device
                # does, never as a comparison an unchecked file could pass a knockout with.
                return None, EarlyVerdict(Verdict("incorrect", f"{name}: {differs.why}"))
            # The copy before the hold: a transfer is not kernels' work, and a waiting timing would drain behind it.
            out = tensors.to_device(out, device)
            with contextlib.nullcontext() if device == "cpu" else self.lock():
                seen = tensors.fingerprint(out, self.key) if self.key is not None else None
                return seen, compare(out, expected, self.tolerance, allowance)
        except torch.OutOfMemoryError:
            return seen, _out_of_memory(device, name)
        except Exception as exc:  # a tensor that loads but cannot be compared: the candidate's verdict
            _device_still_works(device)
            return seen, EarlyVerdict(
                Verdict("incorrect", f"{name} cannot be compared with the reference's output: {type(exc).__name__}: {exc}"[:500])
            )

    def _check_fingerprint(self, name: str, seen: list[int]) -> None:
        recorded = self.fingerprints.get(name)
        if recorded is None or seen != recorded:
            raise EarlyVerdict(
                Verdict(
                    "rejected",
                    f"the output file of {name} is not what the trial returned: it was "
                    f"{'written by someone other than the harness' if recorded is None else 'rewritten after the trial ended'}",
                    guard="output_tampering",
                )
            )


def _device_still_works(device: str) -> None:
    """After an unexpected failure on the device: a judge whose CUDA context a sticky error (an illegal
    address) has lost would fail every later comparison in this process, read as "incorrect". Then the
    process ends and its jobs run again (``unfit.declare``)."""
    lost = context_lost(device)
    if lost:
        unfit.declare(lost)


def _not_read(device: str, name: str, exc: Exception) -> EarlyVerdict:
    """An output sent on the device that the judge failed to clone for a reason that is not plainly the
    sender's (``DeviceExchangeError.senders_fault``): not judged, so it cannot count for the candidate; and
    the judge's own device checked, as after any failure there that is not the candidate's."""
    _device_still_works(device)
    return EarlyVerdict(
        Verdict("runtime_error", f"not judged: the judge could not read the device memory sent for {name}: {exc}"[:500])
    )


def _out_of_memory(device: str, name: str) -> EarlyVerdict:
    return EarlyVerdict(
        Verdict(
            "runtime_error",
            f"not judged: the judge ran out of {device} memory comparing {name} (the device is shared with other evaluations)",
            details={"out_of_memory": True},
        )
    )


@dataclass(frozen=True)
class TrialFiles:
    """The output files a candidate's harness writes, by name, each judged against the expected
    output (and rounding noise) of one reference case: the trials their own, but the knockout case,
    whose knockout, refresh (its clean run) and recall are its; the timed calls' check the case
    named in its file."""

    cand_dir: Path
    ref_dir: Path
    cases: int
    allowances: list[Allowance] | None = None  # per case (``case_allowances``)
    knockout_case: int = 0

    def names(self) -> dict[str, int]:
        """Output name → its case (the timed calls' check runs on one case, named in its file)."""
        return {
            **{f"output_{case}": case for case in range(self.cases) if case != self.knockout_case},
            **{f"output_{trial}": self.knockout_case for trial in KNOCKOUTS},
            "output_refresh": self.knockout_case,
            **{f"output_timed_{case}": case for case in range(self.cases)},
        }

    def output(self, name: str) -> Path:
        return self.cand_dir / f"{name}.pt"

    def expected(self, name: str) -> Path:
        return self.ref_dir / f"expected_{self.names()[name]}.pt"

    def allowance(self, name: str) -> Allowance:
        return self.allowances[self.names()[name]] if self.allowances else Allowance()


def case_allowances(ref_result: ReferenceResult) -> list[Allowance]:
    """Per case, what its comparison allows beyond the tolerance (``Allowance``), from what the
    reference measured and did there."""
    # each list as long as the cases where the reference's harness wrote it (its result is the child's word)
    noise = ref_result.get("rounding_noise") or []
    distributions = ref_result.get("distributions") or []
    families = [set(work["families"]) for work in ref_result.get("work_per_case") or []]

    def allowance(case: int) -> Allowance:
        hidden = case < len(distributions) and distributions[case] != "native"
        sums = case < len(families) and bool(SUMMING_FAMILIES & families[case])
        return Allowance(noise[case] if case < len(noise) else None, sums_cancel=hidden and sums)

    return [allowance(case) for case in range(ref_result["cases"])]


class OutputStream:
    """Judges a candidate's output files while its child still runs, each as soon as the harness
    publishes it, and lets it go. The harness publishes its next output only once fewer than
    ``KZ_REWARD_OUTPUTS_IN_FLIGHT`` wait (a bounded wait), so a candidate's files in the scratch dir stay at
    that many outputs and the one being written (two by default), not all six (three trials, refresh,
    knockout, timed calls), and judging overlaps the child's later trials and timing. Up to ``at_once``
    published outputs are judged at the same time (the copy of one overlaps another's wait for the
    device); ``KZ_REWARD_OUTPUTS_IN_FLIGHT`` sets both. What is left when the child ends is judged in place."""

    POLL_S = 0.01
    MAX_SENT_PER_POLL = 64

    def __init__(
        self, compare_files: FileComparer, files: TrialFiles, at_once: int = 1, exchange: socket.socket | None = None
    ) -> None:
        self.compare_files, self.files, self.exchange = compare_files, files, exchange
        self.pending = list(files.names())  # in the order the harness writes them
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="output-stream", daemon=True)
        self._judges = ThreadPoolExecutor(max_workers=at_once, thread_name_prefix="output-judge")
        self._judging: list[Future[None]] = []
        self._error: BaseException | None = None
        if exchange is not None:
            exchange.setblocking(False)

    def __enter__(self) -> OutputStream:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        self._judges.shutdown(wait=True)
        errors = [self._error] + [judging.exception() for judging in self._judging]
        raised = next((error for error in errors if error is not None), None)
        if raised is not None:  # a judge bug: raised in the worker's thread once the child is done
            raise raised

    def _run(self) -> None:
        try:
            while self.pending and not self._stop.is_set():
                self._take_sent()
                for name in list(self.pending):
                    output = self.files.output(name)
                    try:
                        published = output.is_file()
                    except OSError:  # the candidate made its dir unreadable: left to the judge in place
                        continue
                    if published:
                        judging = self._judges.submit(
                            self.compare_files.consume, output, self.files.expected(name), self.files.allowance(name)
                        )
                        self._judging.append(judging)
                        self.pending.remove(name)
                self._stop.wait(self.POLL_S)
            self._take_sent()  # the child is done: what it sent last is waiting in the socket
        except BaseException as exc:  # a judge bug: raised in the worker's thread once the child is done
            self._error = exc

    def _take_sent(self) -> None:
        """The outputs waiting in the device exchange socket (at most ``MAX_SENT_PER_POLL`` a poll), each judged
        as it comes (``consume_sent``) and acknowledged once judged, which lets the harness send its next. A
        message under a name already taken or not an output's is dropped with its descriptors: the harness's
        record of each output's fingerprint decides what the one judged under its name must have been. An empty
        record (the child hung up, or sent one) ends this poll, not the reading: descriptors parked in the
        socket are taken and closed at every poll until the child is done."""
        for _ in range(self.MAX_SENT_PER_POLL):
            if self.exchange is None:
                return
            try:
                received = device_exchange.receive(self.exchange)  # descriptors beyond MAX_SENT_TENSORS: closed by the kernel
            except BlockingIOError:
                return
            except OSError:  # the socket itself failed: nothing more will come on it
                self.exchange = None
                return
            name = received.message.get("name") if isinstance(received.message, dict) else None
            if name not in self.pending:
                received.close()
                if received.empty:
                    return
                continue
            self.pending.remove(name)
            self._judging.append(self._judges.submit(self._consume_sent, name, received))

    def _consume_sent(self, name: str, received: Received) -> None:
        try:
            self.compare_files.consume_sent(name, received, self.files.expected(name), self.files.allowance(name))
        finally:
            if self.exchange is not None:
                with contextlib.suppress(OSError):
                    self.exchange.send(b"1")


def judge(
    ref_result: ReferenceResult,
    cand_result: CandidateResult,
    files: TrialFiles,
    compare_files: FileComparer,
    audit: list[str] | None = None,
) -> Verdict:
    """The verdict on one candidate; ``audit``: what its child's audit hook refused, read by the worker
    from the audit log (the child's result cannot leave it out). Whatever judging it raises is its own
    ``runtime_error``, never paid, and never its group's failure; only a process unfit to judge on (its device's
    context lost) goes on up (``unfit``)."""
    try:
        return _verdict(ref_result, cand_result, files, compare_files, audit)
    except unfit.ProcessUnfit:
        raise
    except Exception as exc:  # what no check foresaw: a judge bug, or a value the contract allows that the child chose
        log.exception("judge.failed", error=type(exc).__name__)
        _device_still_works(compare_files.device)
        return Verdict("runtime_error", f"not judged: the judge failed on this candidate's result ({type(exc).__name__})")


def _verdict(
    ref_result: ReferenceResult,
    cand_result: CandidateResult,
    files: TrialFiles,
    compare_files: FileComparer,
    audit: list[str] | None,
) -> Verdict:
    status = cand_result.get("status")
    observations = cand_result.get("observations", {})
    if not isinstance(observations, dict):
        observations = {}
    if audit:
        return Verdict(
            "rejected",
            f"the candidate tried what no kernel does: {'; '.join(audit[:3])}"[:1000],
            guard="harness_tampering",
            details={"observations": observations, "audit": audit[:20]},
        )
    guard, reason = cand_result.get("guard"), cand_result.get("reason", "no reason given")
    if status not in CHILD_STATUSES or (guard is not None and guard not in GUARDS) or not isinstance(reason, str):
        # the child's result is data: never a verdict of its own choosing, nor one the schema cannot hold
        return Verdict(
            "runtime_error",
            f"the candidate's harness reported an unknown status {str(status)[:40]!r} or guard {str(guard)[:40]!r}",
            details={"observations": observations},
        )
    if status != "ok":
        details: dict[str, Any] = {"observations": observations, "traceback": cand_result.get("traceback")}
        if cand_result.get("out_of_memory") is True:  # the harness ran short of memory: the worker may run it again
            details["out_of_memory"] = True
        return Verdict(status=status, reason=reason, guard=cast(Guard | None, guard), details=details)
    rejection = guard_observations(observations, ref_result)
    if rejection:
        guard, reason = rejection
        return Verdict("rejected", reason, guard=guard, details={"observations": observations})

    try:
        return _judge_outputs(ref_result, cand_result, files, compare_files, observations)
    except EarlyVerdict as early:
        early.verdict.details["observations"] = observations
        return early.verdict


def _judge_knockout(
    knockout: Comparison, seen: KnockoutObservations, observations: Observations, ref_result: ReferenceResult, max_error: float
) -> Verdict | None:
    """What one knockout's output (everything the custom kernels wrote poisoned) says: a decoy when it
    stays right, PyTorch's work when it changes on too few of its values."""
    if knockout.ok and seen.get("copies"):
        # the kernels only copied (the knockout leaves copies alone): where provenance or the op accounting
        # says PyTorch computed what they carried, that is the more exact verdict
        if observations.get("pytorch_output_kind") == "copied":
            return _made_by_pytorch(observations, max_error)
        delegated = pytorch_work(observations, ref_result)
        if delegated:
            reason = f"{delegated}; the custom kernels only copy"
            return Verdict("rejected", reason, guard="pytorch_fallback", max_abs_error=_finite(max_error))
    if knockout.ok:
        return Verdict(
            "rejected",
            "decoy: the output stays correct when everything the custom kernels wrote is destroyed, "
            "so they do not compute it (PyTorch does, or a result remembered from an earlier call is returned)",
            guard="decoy_kernel",
            max_abs_error=_finite(max_error),
        )
    if knockout.mismatched is not None and knockout.mismatched < MIN_KERNEL_SHARE:
        return Verdict(
            "rejected",
            f"the custom kernels produce {knockout.mismatched:.1%} of the output: with everything they "
            f"wrote destroyed, the other {1 - knockout.mismatched:.1%} of its (unsaturated) values stay right, so "
            f"PyTorch or the host computes them (at least {MIN_KERNEL_SHARE:.0%} must be the kernels')",
            guard="kernel_share",
            max_abs_error=_finite(max_error),
            details={"kernel_share": knockout.mismatched},
        )
    return None


def _made_by_pytorch(observations: Observations, max_error: float) -> Verdict:
    """Provenance's verdict: the refresh trial's output is, value for value, what a PyTorch op made."""
    return Verdict(
        "rejected",
        f"PyTorch made the output, not the custom kernels: it is {observations['pytorch_output']} "
        "(followed through the refresh trial)",
        guard="pytorch_fallback",
        max_abs_error=_finite(max_error),
    )


def _judge_outputs(
    ref_result: ReferenceResult,
    cand_result: CandidateResult,
    files: TrialFiles,
    compare_files: FileComparer,
    observations: Observations,
) -> Verdict:
    def against_reference(name: str) -> Comparison:
        return compare_files(files.output(name), files.expected(name), files.allowance(name))

    def produced(name: str) -> bool:
        return compare_files.produced(files.output(name))

    max_error = 0.0
    trials = files.cases
    for case in range(trials):
        if case == files.knockout_case:  # its clean run is the refresh
            continue
        ok, why, error, _ = against_reference(f"output_{case}")
        max_error = max(max_error, error)
        if not ok:
            return Verdict(
                "incorrect",
                f"trial {case + 1} of {trials}: {why}",
                max_abs_error=_finite(max_error),
                details={"observations": observations},
            )
    ok, why, error, _ = against_reference("output_refresh")  # the knockout case's clean run
    passing_error, max_error = max_error, max(max_error, error)
    if not ok and error <= passing_error:
        # No larger than the errors of the trials that passed: the kernel's rounding crossed the tolerance on
        # these values (an honest fp32 reduction does, now and then), not an answer remembered from other values.
        return Verdict(
            "incorrect",
            f"trial {files.knockout_case + 1} of {trials} (run after the others): {why}",
            max_abs_error=_finite(max_error),
            details={"observations": observations},
        )
    if not ok:
        return Verdict(
            "rejected",
            f"trial {files.knockout_case + 1}'s values, run after the other trials in the tensors one of them used, "
            f"gave a wrong answer ({why}): the candidate returns what an earlier call left (a cache, or memory not "
            "written this call), or is wrong on those values",
            guard="cross_call_cache",
            max_abs_error=_finite(max_error),
        )
    if ref_result.get("input_independent"):
        return Verdict(
            "unverified",
            "the output matches, but this task cannot judge a kernel: the reference gave the same output, bit for bit, "
            "on different inputs, so a kernel that computes its answer cannot be told from one that returns a "
            "remembered or PyTorch-made one (the task is degenerate: fix the reference)",
            max_abs_error=_finite(max_error),
            details={"observations": observations, "task": "input_independent"},
        )
    knockouts = observations.get("knockouts") or {}
    for trial in KNOCKOUTS:
        if not produced(f"output_{trial}"):
            continue
        comparison = against_reference(f"output_{trial}")
        rejection = _judge_knockout(comparison, knockouts.get(trial) or {}, observations, ref_result, max_error)
        if rejection:
            return rejection
        if comparison.mismatched is not None:
            observations["kernel_share"] = min(comparison.mismatched, observations.get("kernel_share", 1.0))
    for trial in KNOCKOUTS:
        seen = knockouts.get(trial) or {}
        if seen.get("raised"):
            return Verdict(
                "rejected",
                f"forward raised when its kernels' results were replaced ({seen['raised'][:200]}): it checks what its "
                "own kernels wrote, hiding from the knockout trial",
                guard="knockout_evasion",
                max_abs_error=_finite(max_error),
            )
        if seen.get("path"):
            return Verdict(
                "rejected",
                "forward took another path when its kernels' results were tampered with than on the same values "
                f"untouched ({seen['path']}): it inspects what its own kernels wrote, a decoy hiding from the knockout trial",
                guard="knockout_evasion",
                max_abs_error=_finite(max_error),
            )
    if observations.get("pytorch_output"):
        return _made_by_pytorch(observations, max_error)
    # An op that refused the knockout's values leaves no measure of the kernels' share: PyTorch's own
    # work must then show it small, as the knockout would have (a refusal is no way around the share).
    refused = next((seen["refused"] for seen in knockouts.values() if seen.get("refused")), None)
    delegated = pytorch_work(observations, ref_result, 1 - MIN_KERNEL_SHARE if refused else FALLBACK_WORK_SHARE)
    if delegated:
        if refused:
            delegated += (
                f" (an op refused the knockout's values, {refused[:120]}: PyTorch's work alone must show the kernels' share)"
            )
        return Verdict("rejected", delegated, guard="pytorch_fallback", max_abs_error=_finite(max_error))

    cand_timing, ref_timing = cand_result.get("timing"), ref_result.get("timing")
    if cand_timing:
        evasion = _timing_evasion(cand_timing, observations, ref_result, files, produced, against_reference)
        if evasion:
            return Verdict("rejected", evasion, guard="timing_evasion", max_abs_error=_finite(max_error))
    verdict = Verdict(
        "correct",
        f"matches the reference on {trials} trials (max abs error {max_error:.3g})",
        max_abs_error=_finite(max_error),
        details={"observations": observations},
    )
    if cand_timing and ref_timing:
        verdict.runtime_ms = cand_timing["median_ms"]
        verdict.ref_runtime_ms = ref_timing["median_ms"]
        verdict.details["timing"] = cand_timing
        verdict.details["ref_timing"] = ref_timing
        implausible = implausible_timing(cand_timing, ref_timing, ref_result)
        if implausible:
            verdict.details["timing_implausible"] = implausible
            verdict.reason += f"; speed not counted: {implausible['why']}"
            return verdict
        verdict.speedup = verdict.ref_runtime_ms / verdict.runtime_ms if verdict.runtime_ms > 0 else None
        if ref_result.get("timing_compiled"):
            verdict.details["speedup_vs_compiled"] = ref_result["timing_compiled"]["median_ms"] / verdict.runtime_ms
    else:
        verdict.reason += "; speed not measured (no GPU)"
    return verdict


def _timing_evasion(
    timing: Timing,
    observations: Observations,
    ref_result: ReferenceResult,
    files: TrialFiles,
    produced: Callable[[str], bool],
    against_reference: Callable[[str], Comparison],
) -> str | None:
    """Why the timed calls were not the checked forward: their check call (on values neither the first
    nor the last timed call had, under the timed calls' conditions) gave a wrong answer, had PyTorch do
    the reference's work or launched fewer custom kernels than a trial, or the timed calls launched fewer."""
    checked = next((name for name in files.names() if name.startswith("output_timed_") and produced(name)), None)
    if checked is None:
        return "the timed calls' output was not kept: forward computes less while it is timed"
    ok, why, _, _ = against_reference(checked)
    if not ok:
        return (
            f"after timing, a call on other values returned a wrong answer ({why}) where the trials were right: the timed "
            "calls return what an earlier call left (a cache keyed on the tensors) or forward computes less while timed"
        )
    per_call, checked_calls = timing.get("launches_per_call"), observations.get("launches_per_case") or [0]
    check = timing.get("check")
    if not isinstance(check, dict):
        return "the call after the timed ones was not recorded: forward's work while it is timed is unknown"
    covered = pytorch_covers_reference(check.get("work"), _reference_work(ref_result, check.get("case")))
    if covered:
        return (
            f"after timing, a call under the timed calls' conditions had PyTorch itself do the reference's "
            f"{', '.join(covered)} work, which the trials' kernels did: forward tells the timed calls from the judged "
            "ones and lets PyTorch compute while it is timed"
        )
    launches = check.get("launches")
    if not isinstance(launches, int) or launches < min(checked_calls):
        return (
            f"after timing, a call under the timed calls' conditions launched {launches} custom kernels where every "
            f"checked call launched at least {min(checked_calls)}: while timed, forward skips its kernels"
        )
    if isinstance(per_call, (int, float)) and per_call < min(checked_calls) - 1e-9:
        return (
            f"the timed calls launched {per_call:.2f} custom kernels each where every checked call launched at least "
            f"{min(checked_calls)}: while timed, forward skips its kernels"
        )
    return None


def implausible_timing(cand: Timing, ref: Timing, ref_result: ReferenceResult) -> dict[str, Any] | None:
    """A candidate time below what moving the problem's bytes (its inputs and outputs, once) allows at
    ``PLAUSIBLE_BANDWIDTH_SHARE`` times the bandwidth the reference's harness measured (its L2 flush, a
    device-wide memset), where the reference itself is above that floor: what the timing measured is
    not the computation (a result cached across calls, say)."""
    flush_ms, flush_bytes = ref.get("flush_ms"), ref.get("flush_bytes")
    moved = (ref_result.get("input_bytes") or 0) + (ref_result.get("output_bytes") or 0)
    if not (isinstance(flush_ms, (int, float)) and flush_ms > 0 and flush_bytes and moved):
        return None
    floor_ms = moved / (flush_bytes / flush_ms) / PLAUSIBLE_BANDWIDTH_SHARE
    if ref["median_ms"] < floor_ms or cand["median_ms"] >= floor_ms:
        return None
    return {
        "floor_ms": floor_ms,
        "bytes": moved,
        "why": (
            f"{cand['median_ms'] * 1e3:.1f} us per call is under the {floor_ms * 1e3:.1f} us that moving its "
            f"{moved / 1e6:.1f} MB "
            f"once takes at {PLAUSIBLE_BANDWIDTH_SHARE:g}x the device's measured bandwidth: the timing measured something else"
        ),
    }


def guard_observations(observations: Observations, ref_result: ReferenceResult) -> tuple[Guard, str] | None:
    """The dynamic guards on what the candidate's process recorded."""
    if observations.get("replaced_functions"):
        return "harness_tampering", f"replaced functions the harness relies on: {', '.join(observations['replaced_functions'])}"
    if observations.get("forged_launches"):
        return "harness_tampering", f"launched a kernel with a forged pointer: {'; '.join(observations['forged_launches'])}"
    if observations.get("native_policy"):
        return "native_policy", f"load_inline sources refused: {'; '.join(observations['native_policy'])}"
    if observations.get("precision_changes"):
        return "precision_downgrade", f"changed precision settings: {'; '.join(observations['precision_changes'])}"
    if observations.get("failed_launches"):
        failed = ", ".join(observations["failed_launches"])
        return (
            "exception_fallback",
            f"custom kernel call(s) {failed} raised and forward still returned: the candidate fell back to another path",
        )
    launches = observations.get("launches_per_case", [])
    if not launches or sum(launches) == 0:
        return (
            "no_custom_kernel",
            "no custom kernel ran during forward (a kernel defined but never launched, or a PyTorch fallback)",
        )
    if 0 in launches:
        return "conditional_fallback", f"no custom kernel ran on trial {launches.index(0) + 1}: forward switches to another path"
    for case, work in enumerate(observations.get("work_per_case") or []):
        if isinstance(work, dict) and isinstance(work.get("host_bytes"), int) and work["host_bytes"] > HOST_BYTES_MAX:
            return "host_compute", (
                f"forward read {work['host_scalars']} values ({work['host_bytes']} bytes) into Python on trial "
                f"{case + 1} (at most {HOST_BYTES_MAX} bytes): the answer is computed on the host, out of the kernels"
            )
    return None


def pytorch_work(observations: Observations, ref_result: ReferenceResult, share: float = FALLBACK_WORK_SHARE) -> str | None:
    """Why PyTorch, not the custom kernels, did the reference's work (at least ``share`` of it) in some
    trial (checked once the outputs were: a decoy gets the knockout's verdict first), or None."""
    for case, work in enumerate(observations.get("work_per_case") or []):
        covered = pytorch_covers_reference(work, _reference_work(ref_result, case), share)
        if covered:
            return (
                f"PyTorch itself does the reference's work on trial {case + 1}: its ops do at least {share:.0%} "
                f"of the reference's {', '.join(covered)} work (synonyms and decompositions count by family, and work of a "
                "kind the reference does not do counts toward each), so the custom kernels do not compute the answer"
            )
    return None


def _reference_work(ref_result: ReferenceResult, case: Any) -> Any:
    """The reference's PyTorch work on ``case``, or on case 0 where it has none recorded for it."""
    ref_work = ref_result.get("work_per_case") or []
    return ref_work[case] if isinstance(case, int) and 0 <= case < len(ref_work) else (ref_work[0] if ref_work else None)


def pytorch_covers_reference(cand: Any, ref: Any, share: float = FALLBACK_WORK_SHARE) -> list[str]:
    """The families of the reference's compute work if the candidate's PyTorch ops of every one of them
    (with what of its other work can stand for that family's, ``_spill``) do at least
    ``share`` of that family's work in the reference; else empty."""
    ref_families = (ref or {}).get("families") if isinstance(ref, dict) else None
    cand_families = cand.get("families") if isinstance(cand, dict) else None
    if not isinstance(ref_families, dict) or not isinstance(cand_families, dict):
        return []
    families = sorted(family for family, work in ref_families.items() if isinstance(work, (int, float)) and work > 0)
    if not families:
        return []
    work = {family: done for family, done in cand_families.items() if isinstance(done, (int, float))}
    combining = cand.get("combining")
    spill = sum(_spill(family, done, ref_families.get(family, 0), combining) for family, done in work.items())
    for family in families:
        own = min(work.get(family, 0), ref_families[family])
        done = own + (spill if family in COMPUTE_FAMILIES else 0)
        if done < share * ref_families[family]:
            return []
    return families


def _spill(family: str, done: float, reference_done: float, combining: Any) -> float:
    """What of a candidate's work in one family can stand for another family's: its compute work beyond
    what the reference does in that family (all of it, in a family the reference has none of), a
    matmul as matmuls over four terms each, a ReLU as a maximum over a stack; of pointwise work only
    what folded values together (a softmax's sums as a tree of additions; a negation of the input
    folds nothing)."""
    if family not in COMPUTE_FAMILIES:
        return 0.0
    beyond = max(0.0, done - reference_done)
    if family == "pointwise":
        return min(beyond, combining) if isinstance(combining, (int, float)) else beyond
    return beyond


def compare(output: Any, expected: Any, tolerance: Tolerance, allowance: Allowance | None = None) -> Comparison:
    """(ok, why not, max abs error, mismatched share) for one trial's output against the reference's,
    with the case's ``allowance``. The mismatched share counts every output tensor's informative values
    (``_informative``) outside tolerance."""
    noise, sums_cancel = allowance or Allowance()
    outs, refs = tensors.tensors_in(output), tensors.tensors_in(expected)
    differs = _kinds_differ(outs, refs)
    if differs is not None:
        return differs
    worst, failure, bad, counted = 0.0, "", 0, 0
    for i, (out, ref) in enumerate(zip(outs, refs)):
        label = f"output {i}" if len(refs) > 1 else "output"
        floor = noise[i] if noise and i < len(noise) and math.isfinite(noise[i]) else 0.0
        ok, why, error, tensor_bad, tensor_counted = _compare_tensor(out, ref, tolerance, max(floor, 0.0), sums_cancel)
        worst = max(worst, error)
        bad, counted = bad + tensor_bad, counted + tensor_counted
        if not ok and not failure:
            failure = f"{label}: {why}"
    return Comparison(not failure, failure, worst, bad / counted if counted else None)


def _kinds_differ(outs: Sequence[torch.Tensor | Claimed], refs: list[torch.Tensor]) -> Comparison | None:
    """The comparison's verdict where the output's tensors are not the reference's in number, shape and
    dtype (read from the tensors' metadata only), else None."""
    if len(outs) != len(refs):
        return Comparison(False, f"returned {len(outs)} tensor(s), the reference returns {len(refs)}", math.inf, 1.0)
    if not refs:
        return Comparison(False, "the reference returned no tensor to compare", math.inf)
    for i, (out, ref) in enumerate(zip(outs, refs)):
        label = f"output {i}" if len(refs) > 1 else "output"
        if out.shape != ref.shape:
            return Comparison(False, f"{label} has shape {tuple(out.shape)}, expected {tuple(ref.shape)}", math.inf, 1.0)
        if out.dtype != ref.dtype:
            return Comparison(
                False, f"{label} has dtype {out.dtype}, expected {ref.dtype} (precision must not be downgraded)", math.inf, 1.0
            )
    return None


def _compare_tensor(
    out: torch.Tensor, ref: torch.Tensor, tolerance: Tolerance, noise: float, sums_cancel: bool = False
) -> tuple[bool, str, float, int, int]:
    """(ok, why not, max abs error, informative values outside tolerance, informative values)."""
    if not (ref.is_floating_point() or ref.is_complex()):  # every place informative: an index, a flag
        differ = int((out != ref).sum())
        return not differ, "integer/boolean values differ" if differ else "", math.inf if differ else 0.0, differ, ref.numel()
    if out.numel() == 0:
        return True, "", 0.0, 0, 0
    atol, rtol = tolerance.for_dtype(ref.dtype)
    # Where the reference measured its own rounding noise (its output looks constant at the tolerance: a
    # centred sum is zero up to rounding), a correct kernel that rounds otherwise differs from it by about
    # that much, more than atol on wide inputs; the structure check below is what tells right from wrong there.
    atol += NOISE_SPREAD * noise
    # Half types are compared in float32, the rest in their own type; a slice at a time, so the
    # comparison needs little memory beside the two outputs (a level-1 output is 6.4 GB).
    compute = torch.promote_types(ref.dtype, torch.float32)
    low, high = (None, None) if ref.is_complex() else _finite_range(ref, compute)
    informative_atol = atol  # the knockout's share counts small values too, whatever the allowance
    if sums_cancel and not ref.is_complex():  # they round at their terms' scale (Allowance)
        atol = max(atol, tolerance.for_dtype(ref.dtype)[0] * _typical_magnitude(ref, compute))
    # The figures accumulate where the tensors are and come to the host once, at the end: on a GPU
    # shared by time slices each host sync waits its turn, and the judge holds the device lock meanwhile.
    # The pass assumes the reference finite, as it nearly always is; where it is not, a second pass
    # takes the error over its finite places and compares the NaN/Inf patterns place by place.
    zero = torch.zeros((), dtype=torch.float64, device=ref.device)
    max_error, outside_count, ref_non_finite, out_non_finite, informative_outside, informative_count = (zero,) * 6
    for out_part, ref_part in tensors.slices(out, ref):
        out_part, ref_part = out_part.to(compute), ref_part.to(compute)
        ref_finite = torch.isfinite(ref_part)
        ref_non_finite = ref_non_finite + (~ref_finite).any()
        out_non_finite = out_non_finite + (~torch.isfinite(out_part)).any()
        max_error = torch.maximum(max_error, (out_part - ref_part).abs().nan_to_num(math.inf).max().to(torch.float64))
        outside = ~torch.isclose(out_part, ref_part, atol=atol, rtol=rtol, equal_nan=True)
        outside_count = outside_count + outside.sum()
        if low is not None and high is not None:  # not complex
            mask = _informative(ref_part, ref_finite, low, high, informative_atol, rtol)
            informative_count = informative_count + mask.sum()
            informative_outside = informative_outside + (outside & mask).sum()
    figures = torch.stack([max_error, outside_count, ref_non_finite, out_non_finite, informative_outside, informative_count])
    error, *counts = figures.tolist()
    bad, non_finite, out_not_finite, informative_bad, informative = (int(v) for v in counts)
    all_finite = not non_finite
    pattern_differs = bool(out_not_finite)
    if not all_finite:
        error, pattern_differs = _error_and_pattern_where_not_finite(out, ref, compute)
    if pattern_differs:
        return False, "NaN/Inf where the reference has none (or the reverse)", math.inf, informative_bad, informative
    if bad:
        return (
            False,
            f"{bad} of {ref.numel()} values outside atol={atol:g} rtol={rtol:g} (max abs error {error:.3g})",
            error,
            informative_bad,
            informative,
        )
    finite = None if all_finite else torch.isfinite(ref)
    ref_c = ref if finite is None else ref[finite]
    if not looks_constant(ref_c, atol, rtol):
        return True, "", error, informative_bad, informative
    out_c = out if finite is None else out[finite]
    ok, why = _reproduces_structure(out_c.to(compute), ref_c.to(compute), ref.dtype, noise)
    return ok, why, error, 0, 0  # values closer than the tolerance itself tell nothing one by one: no share


def _error_and_pattern_where_not_finite(out: torch.Tensor, ref: torch.Tensor, compute: torch.dtype) -> tuple[float, bool]:
    """(the max abs error over the reference's finite places, whether the output's NaN and Inf places
    differ from the reference's), for a reference that is not all finite."""
    zero = torch.zeros((), dtype=torch.float64, device=ref.device)
    max_error, pattern_slices = zero, zero
    for out_part, ref_part in tensors.slices(out, ref):
        out_part, ref_part = out_part.to(compute), ref_part.to(compute)
        ref_finite = torch.isfinite(ref_part)
        pattern_slices = pattern_slices + (
            (torch.isfinite(out_part) != ref_finite).any() | (torch.isnan(out_part) != torch.isnan(ref_part)).any()
        )
        diff = torch.where(ref_finite, (out_part - ref_part).abs(), 0)
        max_error = torch.maximum(max_error, diff.nan_to_num(math.inf).max().to(torch.float64))
    error, differs = torch.stack([max_error, pattern_slices]).tolist()
    return error, bool(differs)


def _finite_range(ref: torch.Tensor, compute: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The smallest and largest finite value of a real ``ref``, as tensors where it is (+inf and -inf
    where it has none: a value within the tolerance of them then cannot be finite anyway)."""
    low = torch.full((), math.inf, dtype=compute, device=ref.device)
    high = torch.full((), -math.inf, dtype=compute, device=ref.device)
    for (part,) in tensors.slices(ref):
        part = part.to(compute)
        is_finite = torch.isfinite(part)
        low = torch.minimum(low, torch.where(is_finite, part, math.inf).min())
        high = torch.maximum(high, torch.where(is_finite, part, -math.inf).max())
    return low, high


TYPICAL_SAMPLE = 1 << 20  # values, evenly strided, whose median magnitude stands for a large output's


def _typical_magnitude(ref: torch.Tensor, compute: torch.dtype) -> float:
    """The median magnitude of ``ref``'s finite values: half of them are at least this large, so a
    few huge ones (an exp's tail) cannot raise it, unlike a mean or a root mean square."""
    flat = ref.reshape(-1)
    sample = flat[:: max(1, flat.numel() // TYPICAL_SAMPLE)].to(compute)
    sample = sample[torch.isfinite(sample)].abs()
    return float(sample.median()) if sample.numel() else 0.0


def _informative(
    ref: torch.Tensor,
    finite: torch.Tensor,
    low: torch.Tensor,
    high: torch.Tensor,
    atol: float,
    rtol: float,
) -> torch.Tensor:
    """Values that tell whether the kernels' writes reached them: finite, and not within the tolerance of
    a saturated value, where glue after the kernels maps poison too and the tolerance cannot tell it
    from the right value: the output's minimum or maximum (a ReLU, a clamp, a tanh or sigmoid on wide
    inputs), or 0 (a softmax's far tail)."""
    mask = finite & (ref.abs() > atol)
    return mask & ((ref - low).abs() > atol + rtol * abs(low)) & ((ref - high).abs() > atol + rtol * abs(high))


def looks_constant(ref: torch.Tensor, atol: float, rtol: float) -> bool:
    """Whether allclose at this tolerance would accept a constant (or zeros) for ``ref``."""
    if ref.numel() < 2:
        return False
    mean = ref.mean(dtype=torch.promote_types(ref.dtype, torch.float32))
    level = complex(mean) if ref.is_complex() else float(mean)
    return tensors.constant_within_tolerance(ref, atol, rtol, (level, 0.0)) is not None


def _reproduces_structure(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, noise: float) -> tuple[bool, str]:
    """Where the tolerance cannot tell the reference from a constant (tiny or near-constant
    outputs), require the output's variation to match the reference's."""
    ref_var = ref - ref.mean()
    # Rounding alone moves a correct output by a few ulps of its magnitude, and where the reference's
    # variation is itself rounding noise (a mean of normalised values is 0 up to rounding) by that
    # noise, as the reference measured it: never demand more.
    allowed = (
        STRUCTURE_TOLERANCE * float(ref_var.norm())
        + NOISE_ULPS * torch.finfo(dtype).eps * float(ref.norm())
        + NOISE_SPREAD * noise
    )
    structure_error = float(((out - out.mean()) - ref_var).norm())
    if structure_error > allowed:
        relative = structure_error / max(float(ref_var.norm()), 1e-300)
        return False, (
            f"passes allclose only because the reference output is tiny or near-constant; the output's variation "
            f"differs from the reference's by {relative:.1%} (degenerate output)"
        )
    return True, ""


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None
