"""The judge: turns the two children's files and observations into one verdict.

Runs in the worker, on data only (tensors loaded with ``weights_only``); no candidate code. On a
GPU host the tensors are compared on the device: GB-sized outputs cost milliseconds there.
Order matters: a candidate is first held to the dynamic guards (did a custom kernel run, did its
result reach the output, did it tamper), then to correctness on every trial.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from reward_svc.harness import tensors
from reward_svc.verdict import Verdict

DEFAULT_TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-4, torch.float16: 1e-2, torch.bfloat16: 1e-2}
# A correct output must reproduce the reference's variation, not just its level: relative L2
# error of the mean-centred output. Applied where a constant or zero output would pass allclose.
STRUCTURE_TOLERANCE = 0.05
NOISE_ULPS = 4
NOISE_SPREAD = 4  # times the reference's measured rounding noise: two roundings differ by ~1.4x it, plus margin
FALLBACK_WORK_SHARE = 0.5
# Outputs up to this size are judged on the host: milliseconds there, and no wait for the device lock
# (behind a queued timing, seconds on a busy GPU worker) for a comparison the device cannot speed up.
HOST_JUDGE_MAX_BYTES = 64 << 20
Comparison = tuple[bool, str, float]  # (ok, why not, max abs error)


@dataclass(frozen=True)
class Tolerance:
    atol: float | None = None
    rtol: float | None = None

    def for_dtype(self, dtype: torch.dtype) -> tuple[float, float]:
        default = DEFAULT_TOLERANCE.get(dtype, 1e-4)
        return (self.atol if self.atol is not None else default, self.rtol if self.rtol is not None else default)


class EarlyVerdict(Exception):
    """A comparison that ends the judging with a verdict of its own: an output file that is not what
    its trial returned, or one that cannot be compared at all."""

    def __init__(self, verdict: Verdict) -> None:
        super().__init__(verdict.reason)
        self.verdict = verdict


Judged = tuple[list[int] | None, Comparison | EarlyVerdict]  # (fingerprint of the bytes judged, what judging them gave)


class FileComparer:
    """Compares an output file with its expected file where the judge runs. Files the child can no
    longer touch are memory-mapped: in the scratch dir, a tmpfs on GPU hosts, a mapped GiB is paged in ten times faster than
    ``torch.load`` copies it (0.1-0.2 s against 2 s on the 2-core CI machine); on a GPU only the copy
    to the device and the arithmetic hold ``lock``, and only for outputs above
    ``HOST_JUDGE_MAX_BYTES`` (smaller ones are compared on the host). The first expected output
    stays mapped (the refresh and knockout trials compare against case 0 again), beside the latest
    one; on the device a comparison holds only its own two outputs (a level-1 output is 6.4 GB),
    and one the device has no room for is compared on the host.

    Under ``key`` each output must still be the bytes the candidate's harness fingerprinted when its
    trial ended (``fingerprints``, reported once the child is done): candidate code that ran after
    a trial (the next one, timing) may have rewritten its file. An output judged while the child
    still ran (``consume``) is held to the fingerprint of the bytes that were judged."""

    def __init__(self, tolerance: Tolerance, device: str = "cpu",
                 lock: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext,
                 fingerprints: dict[str, list[int]] | None = None, key: int | None = None) -> None:
        self.tolerance, self.device, self.lock = tolerance, device, lock
        self.key = key
        self.expect(fingerprints)
        self._loaded: dict[Path, Any] = {}
        self._judged: dict[str, Judged] = {}

    def expect(self, fingerprints: dict[str, list[int]] | None) -> None:
        """The fingerprints the candidate's harness reported (read from the child's result: untrusted)."""
        self.fingerprints = fingerprints if isinstance(fingerprints, dict) else {}

    def produced(self, output: Path) -> bool:
        """Whether the trial behind ``output`` ran: its harness says so where it fingerprints (a file
        deleted later must not pass for a trial that never ran), else the file's presence."""
        return output.stem in self.fingerprints if self.key is not None else output.exists()

    def consume(self, output: Path, expected: Path, noise: float | list[float] | None = None) -> None:
        """Judge ``output`` now, while the child may still run, and let its file go. The file is
        read into this process's memory, not mapped: through a mapping, the child could change the
        bytes between the fingerprint and the comparison, or cut the file short under the reader
        (SIGBUS, the worker's death)."""
        self._judged[output.stem] = self._judge_file(output, expected, noise, private=True)
        with contextlib.suppress(OSError):  # a directory planted under the name: left, and judged in place
            output.unlink(missing_ok=True)

    def __call__(self, output: Path, expected: Path, noise: list[float] | None = None) -> Comparison:
        seen, outcome = self._judged.get(output.stem) or self._judge_file(output, expected, noise)
        if seen is not None:
            self._check_fingerprint(output.stem, seen)
        if isinstance(outcome, EarlyVerdict):
            raise outcome
        return outcome

    def _judge_file(self, output: Path, expected: Path, noise: Any, *, private: bool = False) -> Judged:
        """(the fingerprint of the bytes judged, where they loaded; the comparison or the verdict it ends in)."""
        try:
            out = tensors.load(output, mmap=not private)
        except Exception as exc:  # noqa: BLE001 (a missing or corrupt file is the candidate's verdict, not the worker's crash)
            return None, EarlyVerdict(Verdict("rejected", f"the output file of {output.stem} is missing or unreadable "
                                              f"({type(exc).__name__}) though its trial wrote it", guard="output_tampering"))
        if expected not in self._loaded:
            self._loaded = dict(list(self._loaded.items())[:1])  # keep the first, let the latest go
            self._loaded[expected] = tensors.load(expected)
        if self.device != "cpu" and expected.stat().st_size > HOST_JUDGE_MAX_BYTES:  # the same choice for every trial
            judged = self._compare_on(self.device, output.stem, out, self._loaded[expected], noise)
            if not (isinstance(judged[1], EarlyVerdict) and judged[1].verdict.details.get("out_of_memory")):
                return judged
        return self._compare_on("cpu", output.stem, out, self._loaded[expected], noise)  # small, or the device is full

    def _compare_on(self, device: str, name: str, out: Any, expected: Any, noise: Any) -> Judged:
        seen = None
        try:
            with contextlib.nullcontext() if device == "cpu" else self.lock():
                out = tensors.to_device(out, device)
                seen = tensors.fingerprint(out, self.key) if self.key is not None else None
                return seen, compare(out, tensors.to_device(expected, device), self.tolerance, noise)
        except torch.OutOfMemoryError:
            return seen, EarlyVerdict(Verdict("runtime_error", f"not judged: the judge ran out of {device} memory comparing "
                                              f"{name} (the device is shared with other evaluations)",
                                              details={"out_of_memory": True}))
        except Exception as exc:  # noqa: BLE001 (a tensor that loads but cannot be compared: the candidate's verdict)
            return seen, EarlyVerdict(Verdict("incorrect", f"{name} cannot be compared with the reference's output: "
                                              f"{type(exc).__name__}: {exc}"[:500]))

    def _check_fingerprint(self, name: str, seen: list[int]) -> None:
        recorded = self.fingerprints.get(name)
        if recorded is None or seen != recorded:
            raise EarlyVerdict(Verdict(
                "rejected", f"the output file of {name} is not what the trial returned: it was "
                f"{'written by someone other than the harness' if recorded is None else 'rewritten after the trial ended'}",
                guard="output_tampering"))


@dataclass(frozen=True)
class TrialFiles:
    """The output files a candidate's harness writes, by name, each judged against the expected
    output (and rounding noise) of one reference case: the trials their own, the refresh, knockout
    and timed calls case 0's."""

    cand_dir: Path
    ref_dir: Path
    cases: int
    rounding_noise: list[Any] | None = None

    def names(self) -> dict[str, int]:
        """Output name → its case."""
        return {**{f"output_{case}": case for case in range(self.cases)}, "output_refresh": 0, "output_knockout": 0, "output_timed": 0}

    def output(self, name: str) -> Path:
        return self.cand_dir / f"{name}.pt"

    def expected(self, name: str) -> Path:
        return self.ref_dir / f"expected_{self.names()[name]}.pt"

    def noise(self, name: str) -> Any:
        return (self.rounding_noise or [None] * self.cases)[self.names()[name]]


class OutputStream:
    """Judges a candidate's output files while its child still runs, each as soon as the harness
    publishes it, and lets it go. The harness publishes its next output only once fewer than
    ``evaluate.OUTPUTS_IN_FLIGHT`` wait (a bounded wait), so a candidate's files in the scratch dir stay at
    about two outputs, not all six (three trials, refresh, knockout, timed calls), and judging
    overlaps the child's later trials and timing. What is left when the child ends is judged in place."""

    POLL_S = 0.01

    def __init__(self, compare_files: FileComparer, files: TrialFiles) -> None:
        self.compare_files, self.files = compare_files, files
        self.pending = list(files.names())  # in the order the harness writes them
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="output-stream", daemon=True)
        self._error: BaseException | None = None

    def __enter__(self) -> OutputStream:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        try:
            while self.pending and not self._stop.is_set():
                for name in list(self.pending):
                    output = self.files.output(name)
                    try:
                        published = output.is_file()
                    except OSError:  # the candidate made its dir unreadable: left to the judge in place
                        continue
                    if published:
                        self.compare_files.consume(output, self.files.expected(name), self.files.noise(name))
                        self.pending.remove(name)
                self._stop.wait(self.POLL_S)
        except BaseException as exc:  # noqa: BLE001 (a judge bug: raised in the worker's thread once the child is done)
            self._error = exc


def judge(ref_result: dict[str, Any], cand_result: dict[str, Any], files: TrialFiles, compare_files: FileComparer) -> Verdict:
    status = cand_result.get("status")
    observations = cand_result.get("observations", {})
    if status != "ok":
        details = {"observations": observations, "traceback": cand_result.get("traceback")}
        if cand_result.get("out_of_memory") is True:  # the harness ran short of memory: the worker may run it again
            details["out_of_memory"] = True
        return Verdict(status=status or "runtime_error", reason=cand_result.get("reason", "no reason given"),
                       guard=cand_result.get("guard"), details=details)
    rejection = guard_observations(observations, ref_result.get("compute_ops", {}))
    if rejection:
        guard, reason = rejection
        return Verdict("rejected", reason, guard=guard, details={"observations": observations})

    try:
        return _judge_outputs(ref_result, cand_result, files, compare_files, observations)
    except EarlyVerdict as early:
        early.verdict.details["observations"] = observations
        return early.verdict


def _judge_outputs(ref_result: dict[str, Any], cand_result: dict[str, Any], files: TrialFiles, compare_files: FileComparer,
                   observations: dict[str, Any]) -> Verdict:
    def against_reference(name: str) -> Comparison:
        return compare_files(files.output(name), files.expected(name), files.noise(name))

    def produced(name: str) -> bool:
        return compare_files.produced(files.output(name))

    max_error = 0.0
    trials = files.cases
    for case in range(trials):
        ok, why, error = against_reference(f"output_{case}")
        max_error = max(max_error, error)
        if not ok:
            return Verdict("incorrect", f"trial {case + 1} of {trials}: {why}", max_abs_error=_finite(max_error),
                           details={"observations": observations})
    if produced("output_refresh"):
        ok, why, _ = against_reference("output_refresh")
        if not ok:
            return Verdict("rejected", f"stale result: new values written into the same input tensors gave a wrong answer ({why}); "
                           "the candidate returns what an earlier call left (a cache, or memory not written this call)",
                           guard="cross_call_cache", max_abs_error=_finite(max_error))
    if produced("output_knockout"):
        ok, _, _ = against_reference("output_knockout")
        if ok:
            return Verdict("rejected", "decoy: the output stays correct when everything the custom kernels wrote is destroyed, "
                           "so they do not compute it (PyTorch does, or a result remembered from an earlier call is returned)",
                           guard="decoy_kernel", max_abs_error=_finite(max_error))
    if observations.get("knockout_path"):
        return Verdict("rejected", "forward took another path when its kernels' results were tampered with than on the same values "
                       f"untouched ({observations['knockout_path']}): it inspects what its own kernels wrote, a decoy hiding from "
                       "the knockout trial", guard="knockout_evasion", max_abs_error=_finite(max_error))
    if observations.get("pytorch_output"):
        return Verdict("rejected", f"PyTorch made the output, not the custom kernels: it is {observations['pytorch_output']} "
                       "(followed through the refresh trial)", guard="pytorch_fallback", max_abs_error=_finite(max_error))

    cand_timing, ref_timing = cand_result.get("timing"), ref_result.get("timing")
    if cand_timing:  # what the timed calls returned: a forward that behaves while checked and cuts corners while timed
        ok, why = against_reference("output_timed")[:2] if produced("output_timed") else (False, "none kept")
        if not ok:
            return Verdict("rejected", f"the timed calls returned a wrong answer ({why}) where the trials on the same inputs were right: "
                           "forward computes less while it is timed", guard="timing_evasion", max_abs_error=_finite(max_error))
    verdict = Verdict("correct", f"matches the reference on {trials} trials (max abs error {max_error:.3g})", max_abs_error=_finite(max_error),
                      details={"observations": observations})
    if cand_timing and ref_timing:
        verdict.runtime_ms = cand_timing["median_ms"]
        verdict.ref_runtime_ms = ref_timing["median_ms"]
        verdict.speedup = verdict.ref_runtime_ms / verdict.runtime_ms if verdict.runtime_ms > 0 else None
        verdict.details["timing"] = cand_timing
        verdict.details["ref_timing"] = ref_timing
        if ref_result.get("timing_compiled"):
            verdict.details["speedup_vs_compiled"] = ref_result["timing_compiled"]["median_ms"] / verdict.runtime_ms
    else:
        verdict.reason += "; speed not measured (no GPU)"
    return verdict


def guard_observations(observations: dict[str, Any], ref_ops: dict[str, Any]) -> tuple[str, str] | None:
    """The dynamic guards on what the candidate's process recorded."""
    if observations.get("replaced_functions"):
        return "harness_tampering", f"replaced functions the harness relies on: {', '.join(observations['replaced_functions'])}"
    if observations.get("precision_changes"):
        return "precision_downgrade", f"changed precision settings: {'; '.join(observations['precision_changes'])}"
    if observations.get("failed_launches"):
        failed = ", ".join(observations["failed_launches"])
        return "exception_fallback", f"custom kernel call(s) {failed} raised and forward still returned: the candidate fell back to another path"
    launches = observations.get("launches_per_case", [])
    if not launches or sum(launches) == 0:
        return "no_custom_kernel", "no custom kernel ran during forward (a kernel defined but never launched, or a PyTorch fallback)"
    if 0 in launches:
        return "conditional_fallback", f"no custom kernel ran on trial {launches.index(0) + 1}: forward switches to another path"
    covered = _pytorch_covers_reference(observations.get("compute_ops", {}), ref_ops)
    if covered:
        return "pytorch_fallback", f"PyTorch itself runs the reference's work ({', '.join(covered)}): the custom kernels only move data"
    return None


def _pytorch_covers_reference(cand_ops: dict[str, Any], ref_ops: dict[str, Any]) -> list[str]:
    """The reference's compute ops if the candidate runs every one of them on at least half as
    much data as the reference does; else empty."""
    if not ref_ops:
        return []
    for op, ref in ref_ops.items():
        cand = cand_ops.get(op)
        if cand is None or cand["elements"] < FALLBACK_WORK_SHARE * ref["elements"]:
            return []
    return sorted(ref_ops)


def compare(output: Any, expected: Any, tolerance: Tolerance, noise: list[float] | None = None) -> tuple[bool, str, float]:
    """(ok, why not, max abs error) for one trial's output against the reference's; ``noise``: per
    output tensor, the reference's own rounding noise (L2), where it measured one."""
    outs, refs = tensors.tensors_in(output), tensors.tensors_in(expected)
    if len(outs) != len(refs):
        return False, f"returned {len(outs)} tensor(s), the reference returns {len(refs)}", math.inf
    if not refs:
        return False, "the reference returned no tensor to compare", math.inf
    worst = 0.0
    for i, (out, ref) in enumerate(zip(outs, refs)):
        label = f"output {i}" if len(refs) > 1 else "output"
        if out.shape != ref.shape:
            return False, f"{label} has shape {tuple(out.shape)}, expected {tuple(ref.shape)}", math.inf
        if out.dtype != ref.dtype:
            return False, f"{label} has dtype {out.dtype}, expected {ref.dtype} (precision must not be downgraded)", math.inf
        floor = noise[i] if noise and i < len(noise) and math.isfinite(noise[i]) else 0.0
        ok, why, error = _compare_tensor(out, ref, tolerance, max(floor, 0.0))
        worst = max(worst, error)
        if not ok:
            return False, f"{label}: {why}", worst
    return True, "", worst


def _compare_tensor(out: torch.Tensor, ref: torch.Tensor, tolerance: Tolerance, noise: float) -> tuple[bool, str, float]:
    if not (ref.is_floating_point() or ref.is_complex()):
        equal = torch.equal(out, ref)
        return equal, "" if equal else "integer/boolean values differ", 0.0 if equal else math.inf
    if out.numel() == 0:
        return True, "", 0.0
    atol, rtol = tolerance.for_dtype(ref.dtype)
    # Half types are compared in float32, the rest in their own type; a slice at a time, so the
    # comparison needs little memory beside the two outputs (a level-1 output is 6.4 GB).
    compute = torch.promote_types(ref.dtype, torch.float32)
    error, bad, all_finite = 0.0, 0, True
    for out_part, ref_part in _slices(out, ref):
        out_part, ref_part = out_part.to(compute), ref_part.to(compute)
        ref_finite = torch.isfinite(ref_part)
        if not torch.equal(torch.isfinite(out_part), ref_finite) or not torch.equal(torch.isnan(out_part), torch.isnan(ref_part)):
            return False, "NaN/Inf where the reference has none (or the reverse)", math.inf
        finite_here = bool(ref_finite.all())
        all_finite &= finite_here
        diff = (out_part - ref_part).abs() if finite_here else (out_part - ref_part)[ref_finite].abs()
        if diff.numel():
            error = max(error, float(diff.max()))
        bad += int((~torch.isclose(out_part, ref_part, atol=atol, rtol=rtol, equal_nan=True)).sum())
    if bad:
        return False, f"{bad} of {ref.numel()} values outside atol={atol:g} rtol={rtol:g} (max abs error {error:.3g})", error
    finite = None if all_finite else torch.isfinite(ref)
    ref_c = ref if finite is None else ref[finite]
    if not looks_constant(ref_c, atol, rtol):
        return True, "", error
    out_c = out if finite is None else out[finite]
    ok, why = _reproduces_structure(out_c.to(compute), ref_c.to(compute), ref.dtype, noise)
    return ok, why, error


SLICE_ELEMENTS = 1 << 24


def _slices(*ts: torch.Tensor) -> Iterator[list[torch.Tensor]]:
    """The same flat slice of each tensor in turn (elementwise checks without whole-size temporaries)."""
    flat = [t.reshape(-1) for t in ts]
    for start in range(0, flat[0].numel(), SLICE_ELEMENTS):
        yield [f[start:start + SLICE_ELEMENTS] for f in flat]


def looks_constant(ref: torch.Tensor, atol: float, rtol: float) -> bool:
    """Whether allclose at this tolerance would accept a constant (or zeros) for ``ref``."""
    if ref.numel() < 2:
        return False
    compute = torch.promote_types(ref.dtype, torch.float32)
    level = float(ref.mean(dtype=compute))

    def close_to(value: float) -> bool:
        return all(bool(torch.isclose(torch.full_like(part, value, dtype=compute), part.to(compute), atol=atol, rtol=rtol).all())
                   for (part,) in _slices(ref))

    return close_to(level) or close_to(0.0)


def _reproduces_structure(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, noise: float) -> tuple[bool, str]:
    """Where the tolerance cannot tell the reference from a constant (tiny or near-constant
    outputs), require the output's variation to match the reference's."""
    ref_var = ref - ref.mean()
    # Rounding alone moves a correct output by a few ulps of its magnitude, and where the reference's
    # variation is itself rounding noise (a mean of normalised values is 0 up to rounding) by that
    # noise, as the reference measured it: never demand more.
    allowed = (STRUCTURE_TOLERANCE * float(ref_var.norm()) + NOISE_ULPS * torch.finfo(dtype).eps * float(ref.norm())
               + NOISE_SPREAD * noise)
    structure_error = float(((out - out.mean()) - ref_var).norm())
    if structure_error > allowed:
        relative = structure_error / max(float(ref_var.norm()), 1e-300)
        return False, (f"passes allclose only because the reference output is tiny or near-constant; the output's variation "
                       f"differs from the reference's by {relative:.1%} (degenerate output)")
    return True, ""


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None
