"""Outputs cross from a child to the judge as files loaded with ``weights_only``."""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from services.children import tensor_files, tensors
from services.children.tensor_files import MAX_DEPTH, MAX_DIMS


def test_named_tuple_outputs_load_under_weights_only(tmp_path: Path) -> None:
    """``torch.max(x, dim)`` returns a ``torch.return_types`` class that weights_only refuses."""
    x = torch.randn(4, 5)
    output = [torch.max(x, dim=1), {"sum": x.sum(0)}]
    tensors.save(tmp_path / "out.pt", output)
    loaded = torch.load(tmp_path / "out.pt", weights_only=True)
    values, indices = loaded[0]
    assert type(loaded[0]) is tuple and torch.equal(values, x.max(dim=1).values) and torch.equal(indices, x.argmax(dim=1))
    assert torch.equal(loaded[1]["sum"], x.sum(0))


def _views() -> tuple[torch.Tensor, ...]:
    x = torch.randn(8, 8)
    return x[::2, 1:], x.t(), x[1:3], torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)


def _shared() -> tuple[torch.Tensor, ...]:
    x = torch.randn(3)
    return x, x, x[1:]


def _conjugate_views() -> tuple[torch.Tensor, ...]:
    z = torch.randn(4, dtype=torch.complex64)
    return z.conj(), z.conj().imag


SAVED_DTYPES = (  # those with a legacy storage class (``_rebuild_tensor_v2``) and those without (``_v3``)
    *(torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128, torch.bool),
    *(torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64),
    *(torch.float8_e4m3fn, torch.float8_e5m2, torch.uint16, torch.uint32, torch.uint64),
)
EVERY_SAVE = {  # what a reference's outputs and a case's inputs may be, as save writes them
    "a tensor": lambda: torch.randn(3, 4),
    "every dtype": lambda: tuple(torch.arange(3).to(dtype) for dtype in SAVED_DTYPES),
    "views, compacted or not": _views,
    "one tensor twice, and a view of it": _shared,
    "lazy conjugate and negative views": _conjugate_views,
    "0-dim, empty, and empty with a dim past 2**32": lambda: (torch.tensor(3.0), torch.empty(0, 5), torch.empty(0, 1 << 40)),
    "a 70,000-long dim and stride": lambda: torch.empty(70_000, 3).t(),
    "requires_grad, a Parameter": lambda: (torch.randn(3, requires_grad=True), torch.nn.Parameter(torch.randn(3))),
    "torch.return_types": lambda: torch.randn(3, 4).max(dim=1),
    "one-item and empty containers, None": lambda: ([torch.randn(2)], {"a": torch.randn(2)}, [], (), {}, None),
    "a dict with int keys": lambda: {"a": torch.randn(2), 3: torch.zeros(1, dtype=torch.uint8)},
    "a case's inputs": lambda: [
        torch.randn(2),
        3,
        -70_000,
        1 << 40,
        -(1 << 70),
        2.5,
        float("inf"),
        True,
        None,
        "mean",
        (1, 2),
        torch.half,
    ],
    "nested to the limit": lambda: functools.reduce(lambda inner, _: [inner], range(MAX_DEPTH - 1), [torch.randn(1)]),
    "800 tensors": lambda: [torch.randn(1) for _ in range(800)],
    f"{MAX_DIMS} dims": lambda: torch.randn((1,) * MAX_DIMS),
}


@pytest.mark.parametrize("kind", sorted(EVERY_SAVE))
def test_whatever_save_writes_loads_back_as_it_was(tmp_path: Path, kind: str) -> None:
    """``load`` refuses any file ``save`` could not have written (``tensor_files``): whatever it does write
    loads back, the same values in the same plain containers."""
    saved = EVERY_SAVE[kind]()
    tensors.save(tmp_path / "out.pt", saved)
    loaded = tensors.load(tmp_path / "out.pt")

    def described(obj: Any) -> Any:
        return tensors.map_tensors(tensors.plain(obj), lambda t: (t.dtype, t.shape))

    assert described(loaded) == described(saved)
    assert tensors.fingerprint(loaded, 7) == tensors.fingerprint(saved, 7)


@pytest.mark.parametrize(
    ("value", "why"),
    [
        pytest.param(lambda: [torch.randn(2), 1 + 2j], "names '__builtin__ complex'", id="a Python complex"),
        pytest.param(lambda: [torch.randn(2), torch.device("cpu")], "names 'torch device'", id="a device"),
        pytest.param(lambda: [torch.randn(1) for _ in range(3000)], "data.pkl' is", id="thousands of tensors"),
        pytest.param(
            lambda: functools.reduce(lambda inner, _: [inner], range(MAX_DEPTH), [torch.randn(1)]),
            "deep",
            id="lists past the depth",
        ),
    ],
)
def test_what_load_would_refuse_fails_where_it_is_saved(tmp_path: Path, value: Callable[[], Any], why: str) -> None:
    """A reference's input or output the judge would refuse fails as its harness saves it, saying why (the
    reference's error, not every candidate's)."""
    with pytest.raises(tensor_files.ForeignFile, match=f"out.pt holds what the judge does not read: .*{re.escape(why)}"):
        tensors.save(tmp_path / "out.pt", value())


def test_the_judge_reads_case_0_expected_once_for_its_three_comparisons(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Trial 0, the refresh and the knockout all compare against case 0: a GB-sized file is read once."""
    from reward_svc import verify

    output = torch.randn(256)
    tensors.save(tmp_path / "output.pt", output)
    tensors.save(tmp_path / "expected_0.pt", output.clone())
    tensors.save(tmp_path / "expected_1.pt", output + 1)
    loaded: list[str] = []
    load = tensors.load
    monkeypatch.setattr(verify.tensors, "load", lambda path, *a, **k: loaded.append(path.name) or load(path, *a, **k))
    compare_files = verify.FileComparer(verify.Tolerance())
    verdicts = [
        compare_files(tmp_path / "output.pt", tmp_path / f"{name}.pt")[0]
        for name in ("expected_0", "expected_1", "expected_0", "expected_0")
    ]
    assert verdicts == [True, False, True, True]
    assert loaded.count("expected_0.pt") == 1 and loaded.count("expected_1.pt") == 1


def test_a_fingerprint_changes_with_any_byte_and_with_the_key_not_with_the_layout() -> None:
    x = torch.randn(300, 7)
    key = 0x5EED
    assert tensors.fingerprint(x, key) == tensors.fingerprint(x.clone(), key)
    assert tensors.fingerprint(x.t(), key) == tensors.fingerprint(x.t().contiguous(), key)  # the values, in order
    assert tensors.fingerprint(x[1:], key) == tensors.fingerprint(x[1:].clone(), key)  # a view into a larger buffer
    assert tensors.fingerprint(x, key) != tensors.fingerprint(x, key + 1)
    for flat_index in (0, 1000, x.numel() - 1):
        nudged = x.clone().view(-1)
        nudged[flat_index] = torch.nextafter(nudged[flat_index], torch.tensor(float("inf")))  # one ulp, one element
        assert tensors.fingerprint(nudged.view_as(x), key) != tensors.fingerprint(x, key)
    swapped = x.clone().view(-1)
    swapped[[3, 4]] = swapped[[4, 3]]  # the same bytes in another order
    assert tensors.fingerprint(swapped.view_as(x), key) != tensors.fingerprint(x, key)
    long = torch.randn(3 << 16)
    row = 1 << 16  # the fingerprint lays words out in rows of this length
    for moved in ([5, 5 + row], [5, 5 + 2 * row]):  # swaps one and two rows apart
        changed = long.clone()
        changed[moved] = changed[moved[::-1]]
        assert tensors.fingerprint(changed, key) != tensors.fingerprint(long, key)
    rectangle = long.clone().view(torch.int32)  # +1/-1 at the corners of a rectangle: a sum of row and column weights keeps it
    for position, change in ((7, 1), (9, -1), (7 + row, -1), (9 + row, 1)):
        rectangle[position] += change
    assert tensors.fingerprint(rectangle.view(torch.float32), key) != tensors.fingerprint(long, key)
    z = torch.randn(5, 3, dtype=torch.complex64)  # lazy views a forward may return: the values count, as saved
    assert tensors.fingerprint(z.conj(), key) == tensors.fingerprint(z.conj().resolve_conj(), key)
    assert tensors.fingerprint(z.conj().imag, key) == tensors.fingerprint(z.conj().imag.clone(), key)
    assert tensors.fingerprint(torch.eye(4).to_sparse(), key) == tensors.fingerprint(torch.eye(4), key)
    odd_bytes = torch.arange(7, dtype=torch.uint8)
    assert tensors.fingerprint((odd_bytes, torch.tensor(True)), key) != tensors.fingerprint((odd_bytes, torch.tensor(False)), key)


def _trial_files(tmp_path: Path, key: int) -> tuple[dict, Path, Path]:
    """A candidate's work dir as its harness leaves it (two cases, refresh, knockout), and the reference's."""
    from reward_svc.harness.candidate import TrialOutputs

    ref_dir, cand_dir = tmp_path / "ref", tmp_path / "cand"
    ref_dir.mkdir(parents=True), cand_dir.mkdir(parents=True)
    expected = [torch.randn(64), torch.randn(64)]
    for case, value in enumerate(expected):
        tensors.save(ref_dir / f"expected_{case}.pt", value)
    outputs = TrialOutputs(cand_dir, key)
    for name, value in [  # case 0 is the knockout case: the refresh is its clean run
        ("output_knockout", torch.full((64,), float("nan"))),
        ("output_1", expected[1]),
        ("output_refresh", expected[0]),
        ("output_recall", torch.full((64,), float("nan"))),
    ]:
        outputs.write(_taken(outputs, name, value.clone()))
    result = {"status": "ok", "observations": {"launches_per_case": [1, 1]}, "output_fingerprints": outputs.fingerprints}
    return result, ref_dir, cand_dir


def test_the_judge_rejects_an_output_file_changed_after_its_trial(tmp_path: Path) -> None:
    """Trial outputs are written as each trial ends, while candidate code still runs (later trials,
    timing): a file rewritten, removed or added behind the harness's back is caught by its fingerprint."""
    from reward_svc import verify

    key = 987654321
    result, ref_dir, cand_dir = _trial_files(tmp_path, key)
    ref_result = {"status": "ok", "cases": 2}

    def verdict(fingerprints_key: int = key) -> verify.Verdict:
        compare_files = verify.FileComparer(verify.Tolerance(), fingerprints=result["output_fingerprints"], key=fingerprints_key)
        return verify.judge(ref_result, result, verify.TrialFiles(cand_dir, ref_dir, 2), compare_files)

    assert verdict().status == "correct", verdict().reason
    assert verdict(key + 1).guard == "output_tampering"  # a fingerprint is only good under its key

    correct_later = torch.load(ref_dir / "expected_1.pt")
    tensors.save(cand_dir / "output_1.pt", correct_later.clone())  # same bytes again: still what the trial returned
    assert verdict().status == "correct"
    one_ulp_off = correct_later.clone()
    one_ulp_off[0] = torch.nextafter(one_ulp_off[0], torch.tensor(float("inf")))  # within tolerance, other bytes
    tensors.save(cand_dir / "output_1.pt", one_ulp_off)
    rewritten = verdict()
    assert rewritten.status == "rejected" and rewritten.guard == "output_tampering" and "rewritten" in rewritten.reason

    result, ref_dir, cand_dir = _trial_files(tmp_path / "knockout", key)
    (cand_dir / "output_knockout.pt").unlink()  # a decoy hides its knockout: the judge would skip that guard
    removed = verdict()
    assert removed.status == "rejected" and removed.guard == "output_tampering" and "missing" in removed.reason

    result, ref_dir, cand_dir = _trial_files(tmp_path / "unrecorded", key)
    del result["output_fingerprints"]["output_1"]
    unrecorded = verdict()
    assert unrecorded.guard == "output_tampering" and "someone other than the harness" in unrecorded.reason


def test_a_forward_that_cuts_corners_while_it_is_timed_is_rejected(tmp_path: Path) -> None:
    """After timing, one more call on another case's values, under the timed calls' conditions, is judged
    too (``output_timed_<case>``) and recorded as a trial is (``timing.check``): a forward that counts its
    calls and computes less once timing starts, or that tells the timed calls from the judged ones and has
    PyTorch compute while timed, does not pay."""
    from reward_svc import verify
    from reward_svc.harness.candidate import TrialOutputs

    key = 4242
    result, ref_dir, cand_dir = _trial_files(tmp_path, key)
    kernels_did_it = {"case": 1, "work": {"families": {}, "combining": 0, "host_scalars": 0, "host_bytes": 0}, "launches": 1}
    result["timing"] = {"median_ms": 0.001, "check": kernels_did_it}
    relu = {"families": {"pointwise": 64}, "combining": 0, "host_scalars": 0, "host_bytes": 0}
    ref_result = {"status": "ok", "cases": 2, "timing": {"median_ms": 1.0}, "work_per_case": [relu, relu]}
    outputs = TrialOutputs(cand_dir, key)
    outputs.fingerprints = result["output_fingerprints"]

    def verdict() -> verify.Verdict:
        compare_files = verify.FileComparer(verify.Tolerance(), fingerprints=result["output_fingerprints"], key=key)
        return verify.judge(ref_result, result, verify.TrialFiles(cand_dir, ref_dir, 2), compare_files)

    missing = verdict()  # timed, but no output of the timed calls
    assert missing.status == "rejected" and missing.guard == "timing_evasion", missing.reason
    outputs.write(_taken(outputs, "output_timed_1", torch.zeros(64)))
    cut_corners = verdict()
    assert cut_corners.status == "rejected" and cut_corners.guard == "timing_evasion", cut_corners.reason
    outputs.write(_taken(outputs, "output_timed_1", torch.load(ref_dir / "expected_0.pt")))  # case 0's answer for case 1's values
    stale = verdict()
    assert stale.status == "rejected" and stale.guard == "timing_evasion", stale.reason
    outputs.write(_taken(outputs, "output_timed_1", torch.load(ref_dir / "expected_1.pt")))
    honest = verdict()
    assert honest.status == "correct" and honest.speedup == 1000.0, honest.reason

    result["timing"]["check"] = {**kernels_did_it, "work": relu}  # right answer, PyTorch's work, kernels launched
    pytorch_while_timed = verdict()
    assert pytorch_while_timed.guard == "timing_evasion" and "PyTorch itself" in pytorch_while_timed.reason
    result["timing"]["check"] = {**kernels_did_it, "launches": 0}
    assert verdict().guard == "timing_evasion"
    del result["timing"]["check"]
    assert verdict().guard == "timing_evasion"


def test_the_call_after_the_timed_ones_is_recorded_as_a_trial_is() -> None:
    from reward_svc.harness.candidate import TrialOutputs, _call_as_timed
    from reward_svc.harness.instrument import LaunchCounter
    from services.outcomes import Rejected

    x = torch.randn(64)
    outputs = TrialOutputs(Path("unused"), key=7)
    out, check = _call_as_timed(torch.nn.ReLU(), (x,), LaunchCounter(), outputs, case=1)
    assert torch.equal(out, x.relu())
    assert (check["case"], check["launches"], check["work"]["families"]) == (1, 0, {"pointwise": 64})

    class Shadow(torch.Tensor):  # a subclass would run its own code inside the harness's calls on it
        pass

    with pytest.raises(Rejected, match="plain tensors"):
        _call_as_timed(lambda t: t.relu().as_subclass(Shadow), (x,), LaunchCounter(), outputs, case=1)


def test_outputs_are_judged_as_they_come_and_the_harness_waits_for_the_judge(tmp_path: Path) -> None:
    """While the candidate's child runs, the worker judges each output file it publishes and lets it
    go, and the harness publishes the next only then: a candidate's files in the scratch dir stay at
    one published output (and one being written). The verdict is the one judged in place."""
    import threading

    from reward_svc import verify
    from reward_svc.harness.candidate import TrialOutputs

    key = 31337
    _, ref_dir, _ = _trial_files(tmp_path / "layout", key)
    cand_dir = tmp_path / "streamed"
    cand_dir.mkdir()
    expected = [torch.load(ref_dir / f"expected_{case}.pt") for case in (0, 1)]
    compare_files = verify.FileComparer(verify.Tolerance(), key=key)
    outputs = TrialOutputs(cand_dir, key, in_flight=1)
    published = []
    with verify.OutputStream(compare_files, verify.TrialFiles(cand_dir, ref_dir, 2)):
        for name, value in _wrong_on_trial_2(expected):
            outputs.write(_taken(outputs, name, value))
            published.append(len(list(cand_dir.glob("output_*.pt"))))
    assert published == [1, 1, 1, 1]
    compare_files.expect(outputs.fingerprints)
    result = {"status": "ok", "observations": {"launches_per_case": [1, 1]}, "output_fingerprints": outputs.fingerprints}
    verdict = verify.judge({"status": "ok", "cases": 2}, result, verify.TrialFiles(cand_dir, ref_dir, 2), compare_files)
    assert verdict.status == "incorrect" and verdict.reason.startswith("trial 2 of 2"), verdict.reason

    # Unjudged, the harness waits for the judge: within its bound, then it publishes anyway.
    waiting = TrialOutputs(tmp_path / "layout" / "cand", key, in_flight=1, wait_s=30)
    (tmp_path / "layout" / "cand" / "output_timed.pt").unlink(missing_ok=True)
    writer = threading.Thread(target=waiting.write, args=(_taken(waiting, "output_timed", expected[0]),))
    writer.start()
    time.sleep(0.5)
    assert not (tmp_path / "layout" / "cand" / "output_timed.pt").exists()  # four published files wait for the judge
    for name in ("output_knockout", "output_1", "output_refresh", "output_recall"):
        (tmp_path / "layout" / "cand" / f"{name}.pt").unlink()
    writer.join(10)
    assert (tmp_path / "layout" / "cand" / "output_timed.pt").exists()
    (tmp_path / "late").mkdir()
    late = TrialOutputs(tmp_path / "late", key, in_flight=1, wait_s=0.2)
    late.write(_taken(late, "output_0", expected[0]))
    late.write(_taken(late, "output_1", expected[1]))  # nobody judges: published after the bound
    assert sorted(p.name for p in (tmp_path / "late").iterdir()) == ["output_0.pt", "output_1.pt"]


def test_an_output_judged_early_is_held_to_the_bytes_its_trial_returned(tmp_path: Path) -> None:
    """A file rewritten before the judge takes it is caught by its fingerprint, as when judged at the
    end; one written again after the judge took it changes nothing: the bytes judged were the trial's."""
    from reward_svc import verify

    key = 2718
    result, ref_dir, cand_dir = _trial_files(tmp_path, key)

    def judged_early(rewrite_before: torch.Tensor | None = None, rewrite_after: torch.Tensor | None = None) -> verify.Verdict:
        compare_files = verify.FileComparer(verify.Tolerance(), key=key)
        if rewrite_before is not None:
            tensors.save(cand_dir / "output_1.pt", rewrite_before)
        compare_files.consume(cand_dir / "output_1.pt", ref_dir / "expected_1.pt")
        assert not (cand_dir / "output_1.pt").exists()
        if rewrite_after is not None:
            tensors.save(cand_dir / "output_1.pt", rewrite_after)
        compare_files.expect(result["output_fingerprints"])
        return verify.judge({"status": "ok", "cases": 2}, result, verify.TrialFiles(cand_dir, ref_dir, 2), compare_files)

    assert judged_early(rewrite_after=torch.zeros(64)).status == "correct"
    one_ulp_off = torch.load(ref_dir / "expected_1.pt").clone()
    one_ulp_off[0] = torch.nextafter(one_ulp_off[0], torch.tensor(float("inf")))
    rewritten = judged_early(rewrite_before=one_ulp_off)
    assert rewritten.guard == "output_tampering" and "rewritten" in rewritten.reason, rewritten.reason


def test_an_output_judged_while_its_child_runs_cannot_change_under_the_judge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child still runs while its outputs are judged: bytes it writes into a published file
    after the judge fingerprinted it must not be the ones compared (a mapped file would show them),
    and a directory planted under an output's name costs the candidate its verdict, not the group's."""
    from reward_svc import verify

    key = 1618
    result, ref_dir, cand_dir = _trial_files(tmp_path, key)
    wrong = torch.zeros(64)
    tensors.save(cand_dir / "output_1.pt", wrong)
    result["output_fingerprints"]["output_1"] = tensors.fingerprint(wrong, key)  # what the trial returned: wrong
    right = tmp_path / "right" / "output_1.pt"  # the same name: the same archive layout, so the same size
    right.parent.mkdir()
    tensors.save(right, torch.load(ref_dir / "expected_1.pt"))
    assert right.stat().st_size == (cand_dir / "output_1.pt").stat().st_size
    fingerprint = tensors.fingerprint

    def rewrite_after_fingerprint(obj, fingerprint_key):  # the child's native code, racing the judge
        taken = fingerprint(obj, fingerprint_key)
        if fingerprint_key == key and (cand_dir / "output_1.pt").exists():
            with open(cand_dir / "output_1.pt", "r+b") as same_file:
                same_file.write(right.read_bytes())
        return taken

    compare_files = verify.FileComparer(verify.Tolerance(), key=key)
    with monkeypatch.context() as patch:
        patch.setattr(verify.tensors, "fingerprint", rewrite_after_fingerprint)
        compare_files.consume(cand_dir / "output_1.pt", ref_dir / "expected_1.pt")
    compare_files.expect(result["output_fingerprints"])
    judged = verify.judge({"status": "ok", "cases": 2}, result, verify.TrialFiles(cand_dir, ref_dir, 2), compare_files)
    assert judged.status == "incorrect" and judged.reason.startswith("trial 2 of 2"), judged.reason

    result, ref_dir, cand_dir = _trial_files(tmp_path / "planted", key)
    (cand_dir / "output_refresh.pt").unlink()
    (cand_dir / "output_refresh.pt").mkdir()
    compare_files = verify.FileComparer(verify.Tolerance(), key=key)
    with verify.OutputStream(compare_files, verify.TrialFiles(cand_dir, ref_dir, 2)):
        deadline = time.monotonic() + 10
        while (cand_dir / "output_1.pt").exists() and time.monotonic() < deadline:  # the stream takes the real ones
            time.sleep(0.01)
    compare_files.expect(result["output_fingerprints"])
    planted = verify.judge({"status": "ok", "cases": 2}, result, verify.TrialFiles(cand_dir, ref_dir, 2), compare_files)
    assert planted.guard == "output_tampering" and "missing or unreadable" in planted.reason, planted.reason


def test_outputs_published_together_are_judged_at_once_with_the_same_verdict(tmp_path: Path) -> None:
    """With two outputs in flight the judge compares two at a time (one's copy overlaps the other's
    wait for the device), and reaches the verdict it reaches one at a time."""
    key = 4242
    _, ref_dir, _ = _trial_files(tmp_path / "layout", key)
    one, most_one = _judge_streamed(tmp_path / "one", ref_dir, key, at_once=1)
    two, most_two = _judge_streamed(tmp_path / "two", ref_dir, key, at_once=2)
    assert (most_one, most_two) == (1, 2)
    assert one == two and one[1].startswith("trial 2 of 2"), (one, two)


def _judge_streamed(cand_dir: Path, ref_dir: Path, key: int, at_once: int) -> tuple[tuple[str, str], int]:
    """(the verdict on four outputs published ``at_once`` at a time, the most judged at the same time)."""
    import threading

    from reward_svc import verify
    from reward_svc.harness.candidate import TrialOutputs

    cand_dir.mkdir()
    expected = [torch.load(ref_dir / f"expected_{case}.pt") for case in (0, 1)]
    compare_files = verify.FileComparer(verify.Tolerance(), key=key)
    judging, now, most = threading.Lock(), [0], [0]
    judge_file = compare_files._judge_file

    def slow_judge(*args: object, **kwargs: object) -> verify.Judged:
        with judging:
            now[0] += 1
            most[0] = max(most[0], now[0])
        time.sleep(0.3)  # long enough that the next published output is seen meanwhile
        try:
            return judge_file(*args, **kwargs)
        finally:
            with judging:
                now[0] -= 1

    compare_files._judge_file = slow_judge
    outputs = TrialOutputs(cand_dir, key, in_flight=at_once)
    with verify.OutputStream(compare_files, verify.TrialFiles(cand_dir, ref_dir, 2), at_once=at_once):
        for name, value in _wrong_on_trial_2(expected):
            outputs.write(_taken(outputs, name, value))
    compare_files.expect(outputs.fingerprints)
    result = {"status": "ok", "observations": {"launches_per_case": [1, 1]}, "output_fingerprints": outputs.fingerprints}
    verdict = verify.judge({"status": "ok", "cases": 2}, result, verify.TrialFiles(cand_dir, ref_dir, 2), compare_files)
    return (verdict.status, verdict.reason), most[0]


def test_the_timing_check_runs_on_a_case_with_the_timed_models_weights() -> None:
    """Case k is built with weight seed k mod 2: after timing on case 0's model, the check call's case
    must have those weights too (case 2), or its expected output is another model's."""
    from reward_svc.harness.candidate import check_position

    assert check_position([0, 1, 2], 2) == 2
    assert check_position([0, 1], 2) == 1  # no other case with case 0's weights: the next, with its own model
    assert check_position([0, 2], 2) == 1
    assert check_position([0], 2) == 0


def test_the_knockout_case_is_a_secret_pick_among_all_the_cases() -> None:
    """No trial is one a forward could know is not the knockout: every case is picked, each often; where
    a reference op acts as a copy on the picked case, copies are poisoned there."""
    from collections import Counter

    from reward_svc.evaluate import choose_knockout_case

    reference = {"status": "ok", "cases": 3, "copying_per_case": [[], ["aten.clamp"], []]}
    picks = Counter(choose_knockout_case(reference) for _ in range(600))
    assert set(picks) == {(0, False), (1, True), (2, False)} and min(picks.values()) > 130, picks
    assert {choose_knockout_case({"status": "ok", "cases": 2}) for _ in range(200)} == {(0, False), (1, False)}


def test_a_refresh_wrong_by_no_more_than_the_passing_trials_rounding_is_incorrect_not_a_cache(tmp_path: Path) -> None:
    """The refresh is the knockout case's only clean run, after the other trials, in their tensors: an answer
    remembered from their values fails it by the values' own size (``cross_call_cache``), but an honest kernel
    whose rounding crosses the tolerance there, by no more than it erred on the trials that passed (where
    larger values gave it room), is incorrect, not accused of a hack."""
    from reward_svc import verify
    from reward_svc.harness.candidate import TrialOutputs

    key = 1357
    result, ref_dir, cand_dir = _trial_files(tmp_path, key)
    expected = [torch.load(ref_dir / f"expected_{case}.pt") for case in range(2)]
    outputs = TrialOutputs(cand_dir, key)
    outputs.fingerprints = result["output_fingerprints"]
    rounded = expected[1].clone()
    largest = int(rounded.abs().argmax())
    rounded[largest] += 1e-4 * float(rounded[largest].abs())  # within rtol on its largest value: passes
    outputs.write(_taken(outputs, "output_1", rounded))

    def verdict() -> verify.Verdict:
        compare_files = verify.FileComparer(verify.Tolerance(), fingerprints=result["output_fingerprints"], key=key)
        return verify.judge({"status": "ok", "cases": 2}, result, verify.TrialFiles(cand_dir, ref_dir, 2), compare_files)

    passing_error = 1e-4 * float(expected[1].abs().max())
    refresh = expected[0].clone()
    smallest = int(refresh.abs().argmin())
    refresh[smallest] += 0.9 * passing_error  # beyond atol + rtol on a value near 0, within the passing trial's error
    outputs.write(_taken(outputs, "output_refresh", refresh))
    rounding = verdict()
    assert rounding.status == "incorrect" and rounding.guard is None and "trial 1 of 2" in rounding.reason, rounding.reason

    outputs.write(_taken(outputs, "output_refresh", expected[1].clone()))  # the other trial's answer, remembered
    remembered = verdict()
    assert remembered.status == "rejected" and remembered.guard == "cross_call_cache", remembered.reason


def _with(values: torch.Tensor, **at: float) -> torch.Tensor:
    """A copy of ``values`` with the given values at the places named ``i<index>``."""
    changed = values.clone()
    for place, value in at.items():
        changed[int(place[1:])] = value
    return changed


INF, NAN = float("inf"), float("nan")
LONG = torch.linspace(-3, 3, 3 * tensors.HOST_SLICE_ELEMENTS + 7)  # several slices and a tail
LAST = LONG.numel() - 1


@pytest.mark.parametrize(
    ("out", "ref", "ok", "why", "error"),
    [
        (LONG + 1e-6, LONG, True, "", pytest.approx(1e-6, rel=0.1)),
        (_with(LONG, **{f"i{LAST}": NAN}), LONG, False, "NaN/Inf where", INF),  # in the last slice's tail
        (_with(LONG, i5=INF, **{f"i{LAST}": NAN}), _with(LONG, i5=INF, **{f"i{LAST}": NAN}), True, "", 0.0),
        (_with(LONG + 1e-3, i5=INF), _with(LONG, i5=INF), False, "values outside", pytest.approx(1e-3, rel=0.01)),
        (_with(LONG, i5=NAN), _with(LONG, i5=INF), False, "NaN/Inf where", INF),  # NaN for Inf: another pattern
        (_with(LONG, i5=-INF), _with(LONG, i5=INF), False, "1 of", 0.0),  # the same pattern, another value
        (LONG, _with(LONG, i9=NAN), False, "NaN/Inf where", INF),
    ],
)
def test_the_judge_compares_finite_values_and_the_nan_inf_pattern_apart(
    out: torch.Tensor, ref: torch.Tensor, ok: bool, why: str, error: object
) -> None:
    """The comparison's first pass assumes a finite reference; one that is not gets a second pass over
    its finite places (the error) and its NaN/Inf places (the pattern, place by place)."""
    from reward_svc import verify

    comparison = verify.compare(out, ref, verify.Tolerance())
    assert comparison.ok == ok and why in comparison.why and comparison.error == error, comparison


def _taken(outputs: Any, name: str, value: torch.Tensor) -> tuple[str, Any]:
    """What the harness does with a judged call's output: fingerprinted when forward returned, taken once final."""
    outputs.returned(value)
    return outputs.take(name, value)


def _wrong_on_trial_2(expected: list[torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
    """A candidate's outputs, in the order its harness writes them, the second trial's wrong."""
    return [
        ("output_knockout", torch.zeros(64)),
        ("output_1", expected[1] + 1),
        ("output_refresh", expected[0].clone()),
        ("output_recall", torch.zeros(64)),
    ]


def test_the_poison_reaches_an_expanded_tensors_memory_and_float8_values() -> None:
    """Found by a review: an in-place write refuses a tensor whose places hold several elements, and
    float8 has no random draws; the knockout read either failure as the forward hiding."""
    bias = torch.randn(16)
    expanded, before = bias.expand(4, 16), bias.clone()
    tensors.poison_(expanded)
    assert not torch.equal(bias, before)
    eight = torch.randn(64).to(torch.float8_e4m3fn)
    before = eight.clone()
    tensors.poison_(eight)
    assert (eight.float() != before.float()).float().mean() > 0.5
    strided = torch.randn(8, 8)[:, ::2]
    assert tensors.memory_of(strided) is strided  # no place holds two elements: poisoned as it is
