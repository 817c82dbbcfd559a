"""What a child's signed result may hold: native code in a candidate's process (or a reference module, untrusted
too) can sign whatever it writes. Fields of the wrong type, keys nested hundreds deep or a result of megabytes
made the judge or the verdict's redaction raise, and the whole group lost its verdicts; now such a result is
refused by its contract (``reward_svc.protocol``) and is that child's runtime error, and whatever else judging
one candidate raises is that candidate's runtime error, never paid. The judge's own device failing still ends
its process (``unfit``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from reward_cases import CORRECT, RELU_REFERENCE
from reward_svc import verify
from reward_svc.evaluate import Evaluator
from reward_svc.protocol import RESULT_MAX_BYTES, candidate_result
from services.children import tensors
from services.children.pool import FORGED_RESULT, Child
from services.queue import unfit
from services.queue.unfit import ProcessUnfit
from services.schemas.reward import ScoreOptions, Verdict

CPU = ScoreOptions(backend="triton", device="cpu", timeout_s=120)


def _nested(depth: int) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for _ in range(depth):
        nested = {"deeper": nested}
    return nested


# each merged into an honest candidate's own signed result, as native code in its process could
FORGERIES: dict[str, dict[str, Any]] = {
    "ints_where_strings_are_joined": {"observations": {"launches_per_case": [1, 1, 1], "forged_launches": [1, 2]}},
    "reason_and_traceback_of_ints": {"status": "runtime_error", "reason": [1, 2], "traceback": [3, 4]},
    "observations_600_deep": {"observations": {"launches_per_case": [1, 1, 1], "notes": _nested(600)}},
    "phases_of_strings": {"phases": {"trials": "fast"}, "trial_holds": {"trial": "short"}},
    "fingerprints_of_another_type": {"output_fingerprints": {"output_0": "the bytes judged"}},
    "builds_nested": {"builds": [{"name": _nested(3)}]},
    "timing_of_strings": {"timing": {"median_ms": "0"}},
    "megabytes": {"traceback": "x" * RESULT_MAX_BYTES},
}


def _forging(monkeypatch: pytest.MonkeyPatch, forge: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]) -> None:
    """Every child's signed result as ``forge(spec, result)`` makes it, in place of the harness's."""
    run = Child.run

    def forged_run(child: Child, spec: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        outcome, answer = run(child, spec, *args, **kwargs)
        return outcome, None if answer is None else forge(spec, answer)

    monkeypatch.setattr(Child, "run", forged_run)


def _forged_candidate(spec: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    if spec["role"] != "candidate":
        return answer
    marked = Path(spec["candidate_path"]).read_text().rsplit("# forged: ", 1)
    return {**answer, **FORGERIES[marked[1].strip()]} if len(marked) == 2 else answer


@pytest.mark.slow
def test_a_forged_result_is_its_candidates_runtime_error_and_its_group_keeps_its_verdicts(
    evaluator: Evaluator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each forgery rides on an honest candidate's own result (without it, each would be correct, or fail the
    group): refused, that candidate's verdict only, while the honest candidate beside them is judged correct."""
    _forging(monkeypatch, _forged_candidate)
    names = sorted(FORGERIES)
    candidates = [CORRECT, *(f"{CORRECT}\n# forged: {name}\n" for name in names)]
    honest, *forged = evaluator.evaluate_group(RELU_REFERENCE, candidates, CPU).verdicts
    assert honest.correct, f"{honest.status}/{honest.guard}: {honest.reason}"
    for name, verdict in zip(names, forged):
        assert verdict.status == "runtime_error" and not verdict.correct, f"{name}: {verdict.status}: {verdict.reason}"
        assert verdict.reason.startswith("the candidate's harness wrote a result the schema refuses: "), verdict.reason
        assert len(verdict.reason) < 500, name


@pytest.mark.slow
@pytest.mark.parametrize(
    ("forge", "why"),
    [
        pytest.param(
            lambda answer: {**answer, "cases": "3"},
            "the reference's harness wrote a result the schema refuses: cases",
            id="cases",
        ),
        pytest.param(
            lambda answer: dict(FORGED_RESULT), "the reference's child's result is not the one its harness wrote", id="unsigned"
        ),
    ],
)
def test_a_forged_reference_result_is_every_candidates_runtime_error(
    evaluator: Evaluator, monkeypatch: pytest.MonkeyPatch, forge: Callable[[dict[str, Any]], dict[str, Any]], why: str
) -> None:
    """A reference module runs in its child as a candidate does (proposed, or any caller's): a result with its
    cases as a string failed the group's job; now each candidate is told the reference could not be evaluated,
    and why (an unsigned result, the pool's stand-in, says so rather than how the stand-in fails the schema)."""
    _forging(monkeypatch, lambda spec, answer: forge(answer) if spec["role"] == "reference" else answer)
    verdicts = evaluator.evaluate_group(RELU_REFERENCE, [CORRECT, CORRECT], CPU).verdicts
    for verdict in verdicts:
        assert verdict.status == "runtime_error", verdict.reason
        assert verdict.reason.startswith(f"the reference could not be evaluated: {why}"), verdict.reason


def _copied_output(tmp_path: Path) -> tuple[verify.TrialFiles, verify.FileComparer]:
    """One case, the knockout's: its refresh and its knockout both the reference's answer (a decoy's)."""
    ref_dir, cand_dir = tmp_path / "ref", tmp_path / "cand"
    ref_dir.mkdir(), cand_dir.mkdir()
    answer = torch.randn(64)
    tensors.save(ref_dir / "expected_0.pt", answer)
    for name in ("output_refresh", "output_knockout"):
        tensors.save(cand_dir / f"{name}.pt", answer)
    return verify.TrialFiles(cand_dir, ref_dir, 1), verify.FileComparer(verify.Tolerance())


# The contract allows it (each field optional), the harness never writes it: provenance's kind without its op.
COPIED_WITHOUT_ITS_OP = {
    "status": "ok",
    "observations": {"launches_per_case": [1], "pytorch_output_kind": "copied", "knockouts": {"knockout": {"copies": 1}}},
}


def test_what_judging_a_candidate_raises_is_its_runtime_error(tmp_path: Path) -> None:
    """A result the contract lets through can still reach a path no check foresaw (a decoy's knockout that copied,
    with provenance's kind and not its op): the judge's KeyError is that candidate's verdict, not its group's."""
    assert candidate_result(COPIED_WITHOUT_ITS_OP) == COPIED_WITHOUT_ITS_OP
    files, compare_files = _copied_output(tmp_path)
    verdict = verify.judge({"status": "ok", "cases": 1}, COPIED_WITHOUT_ITS_OP, files, compare_files)
    assert verdict.status == "runtime_error" and not verdict.correct, verdict.reason
    assert verdict.reason == "not judged: the judge failed on this candidate's result (KeyError)"


def test_a_judge_whose_device_is_lost_still_ends_its_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An exception in judging is the candidate's only where the judge's device still works: a lost CUDA
    context fails every later comparison, so its process ends (here, with no jobs run: ``ProcessUnfit``)."""
    files, compare_files = _copied_output(tmp_path)
    compare_files.device = "cuda:0"
    monkeypatch.setattr(unfit, "_exits", False)
    monkeypatch.setattr(verify, "context_lost", lambda device: f"the CUDA context of {device} failed")
    with pytest.raises(ProcessUnfit, match="the CUDA context of cuda:0 failed"):
        verify.judge({"status": "ok", "cases": 1}, COPIED_WITHOUT_ITS_OP, files, compare_files)


def _views_judged(
    tmp_path: Path, output: list[torch.Tensor], monkeypatch: pytest.MonkeyPatch, recorded: list[int] | None = None
) -> tuple[Verdict, int]:
    """(the verdict on a first trial whose output file holds ``output``, the tensors fingerprinted judging it), the
    file held to ``recorded``, by default the fingerprints of what it holds (native code that writes a file can
    sign its fingerprints too)."""
    ref_dir, cand_dir = tmp_path / "ref", tmp_path / "cand"
    ref_dir.mkdir(parents=True), cand_dir.mkdir()
    tensors.save(ref_dir / "expected_0.pt", torch.randn(1 << 14))
    torch.save(output, cand_dir / "output_0.pt")  # views of one storage stay one storage in the file
    key = 12345
    fingerprints = {"output_0": tensors.fingerprint(output, key) if recorded is None else recorded}
    compare_files = verify.FileComparer(verify.Tolerance(), key=key, fingerprints=fingerprints)
    fingerprinted = [0]
    fingerprint_tensor = tensors._fingerprint_tensor

    def counted(t: torch.Tensor, key: int) -> int:
        fingerprinted[0] += 1
        return fingerprint_tensor(t, key)

    monkeypatch.setattr(tensors, "_fingerprint_tensor", counted)
    files = verify.TrialFiles(cand_dir, ref_dir, 2, knockout_case=1)
    verdict = verify.judge(
        {"status": "ok", "cases": 2}, {"status": "ok", "observations": {"launches_per_case": [1, 1]}}, files, compare_files
    )
    return verdict, fingerprinted[0]


def test_many_views_of_one_storage_are_not_fingerprinted_one_by_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 64-KiB file whose output is 100 full-size views of its one storage: 6.4 MB to fingerprint (a thousand
    views of a GB-sized output: a TB) for an output that is not the reference's one tensor anyway."""
    verdict, fingerprinted = _views_judged(tmp_path, [torch.randn(1 << 14)] * 100, monkeypatch)
    assert verdict.status == "incorrect" and "returned 100 tensor(s), the reference returns 1" in verdict.reason, verdict.reason
    assert fingerprinted == 0


def test_other_tensors_within_the_files_size_are_still_held_to_their_fingerprint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the output's bytes fit its file, the structure check first changes no verdict: two tensors where the
    reference returns one are fingerprinted as before, and a file rewritten after its trial is tampering."""
    output = [torch.randn(1 << 13), torch.randn(1 << 13)]
    verdict, fingerprinted = _views_judged(tmp_path, output, monkeypatch)
    assert verdict.status == "incorrect" and "returned 2 tensor(s)" in verdict.reason and fingerprinted == 2
    rewritten, _ = _views_judged(tmp_path / "rewritten", output, monkeypatch, recorded=[1, 2])
    assert rewritten.status == "rejected" and rewritten.guard == "output_tampering", rewritten.reason
