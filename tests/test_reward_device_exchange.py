"""The judge's end of the device exchange (verify.OutputStream with a socket, FileComparer.consume_sent), on
what it decides before it maps any device memory: a message is only data from the candidate's process.
The GPU half (memory actually mapped and cloned) is tests/test_device_exchange_gpu.py."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest
import torch

from reward_svc import verify
from services.children import device_exchange, tensors
from services.queue import unfit
from services.queue.unfit import ProcessUnfit


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def _stream(tmp_path: Path) -> tuple[verify.FileComparer, verify.TrialFiles, socket.socket, socket.socket]:
    ref_dir, cand_dir = tmp_path / "ref", tmp_path / "cand"
    ref_dir.mkdir()
    cand_dir.mkdir()
    for case in range(2):
        tensors.save(ref_dir / f"expected_{case}.pt", torch.randn(4, 8))
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    return verify.FileComparer(verify.Tolerance()), verify.TrialFiles(cand_dir, ref_dir, 2, knockout_case=1), ours, theirs


def _send(sock: socket.socket, message: object) -> None:
    """A message with a descriptor the judge must close (a pipe's read end; the write end closed here)."""
    read_end, write_end = os.pipe()
    try:
        socket.send_fds(sock, [json.dumps(message).encode()], [read_end])
    finally:
        os.close(read_end)
        os.close(write_end)


def test_a_message_the_judge_cannot_map_ends_the_judging_and_is_acknowledged(tmp_path: Path) -> None:
    """What the judge decides from a description alone can never count for the candidate: a description
    it cannot use is tampering, one of the wrong tensors is incorrect, and either ends the judging (it has
    no bytes to hold to the harness's fingerprint). A knockout "judged wrong" from a forged description
    would have passed a decoy."""
    compare_files, files, ours, theirs = _stream(tmp_path)
    before = _open_fds()
    with verify.OutputStream(compare_files, files, exchange=ours) as stream:
        _send(theirs, {"name": "output_0", "tensors": [{"dtype": "torch.float32", "shape": [4, 8, -1]}]})
        _send(theirs, {"name": "output_knockout", "tensors": [{"dtype": "torch.float16", "shape": [4, 8]}]})
        _send(theirs, {"name": "output_refresh", "tensors": [{"dtype": "torch.float32", "shape": [8, 4]}]})
        _send(theirs, {"name": "output_recall", "tensors": []})  # nothing to map: not a way round the knockout
        _send(theirs, {"name": "output_timed_0", "tensors": [{"dtype": "torch.float64", "shape": [1 << 47, 1 << 47]}]})
        theirs.settimeout(10)
        acknowledged = b"".join(theirs.recv(64) for _ in range(5))
        assert not {"output_0", "output_knockout", "output_refresh", "output_recall", "output_timed_0"} & set(stream.pending)
    assert acknowledged == b"11111"
    assert _open_fds() - before == set()  # every descriptor that came with them is closed
    outcomes = {name: judged[1] for name, judged in compare_files._judged.items()}
    assert all(isinstance(outcome, verify.EarlyVerdict) for outcome in outcomes.values()), outcomes
    verdicts = {name: outcome.verdict for name, outcome in outcomes.items() if isinstance(outcome, verify.EarlyVerdict)}
    for name in ("output_0", "output_recall"):  # not a description of tensors at all
        assert verdicts[name].status == "rejected" and verdicts[name].guard == "output_tampering", name
    assert verdicts["output_timed_0"].status == "incorrect"  # 2**94 values where the answer has 32: not mapped
    assert verdicts["output_knockout"].status == "incorrect" and "has dtype torch.float16" in verdicts["output_knockout"].reason
    assert (
        verdicts["output_refresh"].status == "incorrect"
        and "has shape (8, 4), expected (4, 8)" in verdicts["output_refresh"].reason
    )
    outcome = compare_files._judged["output_knockout"][1]
    with pytest.raises(verify.EarlyVerdict):  # the judging ends there
        compare_files(files.output("output_knockout"), files.expected("output_knockout"))
    assert isinstance(outcome, verify.EarlyVerdict)


def test_a_message_under_a_name_taken_or_unknown_is_dropped_with_its_descriptors(tmp_path: Path) -> None:
    compare_files, files, ours, theirs = _stream(tmp_path)
    before = _open_fds()
    with verify.OutputStream(compare_files, files, exchange=ours):
        malformed = {"name": "output_0", "tensors": "everything"}
        _send(theirs, malformed)
        theirs.settimeout(10)
        assert theirs.recv(64) == b"1"
        _send(theirs, {"name": "output_0", "tensors": [{"dtype": "torch.float32", "shape": [4, 8]}]})  # again: dropped
        _send(theirs, {"name": "../../etc/passwd", "tensors": []})
        _send(theirs, ["not", "a", "message"])
        read_end, write_end = os.pipe()
        socket.send_fds(theirs, [b"[" * 60000], [read_end])  # past the JSON parser's depth: RecursionError
        os.close(read_end)
        os.close(write_end)
        time.sleep(0.5)
        theirs.setblocking(False)
        try:
            extra = theirs.recv(64)
        except BlockingIOError:
            extra = b""
    assert extra == b""  # nothing judged, nothing acknowledged
    assert _open_fds() - before == set()
    assert set(compare_files._judged) == {"output_0"}


def test_no_message_can_fail_the_group_or_pin_the_workers_descriptors(tmp_path: Path) -> None:
    """Whatever a message holds, it becomes its output's verdict: an unhashable dtype used to raise in the
    judge and lose every verdict of the group. More descriptors than an output may have tensors are the
    sender's doing: the kernel closes the excess, and the output is tampering."""
    compare_files, files, ours, theirs = _stream(tmp_path)
    before = _open_fds()
    with verify.OutputStream(compare_files, files, exchange=ours):
        _send(theirs, {"name": "output_0", "tensors": [{"dtype": ["torch.float32"], "shape": [4, 8]}]})
        _send(theirs, {"name": "output_refresh", "tensors": [{"dtype": "torch.float32", "shape": [4, 8]}] * 17})
        pipes = [os.pipe() for _ in range(device_exchange.MAX_SENT_TENSORS + 4)]
        described = {"name": "output_recall", "tensors": [{"dtype": "torch.float32", "shape": [4, 8]}]}
        socket.send_fds(theirs, [json.dumps(described).encode()], [read_end for read_end, _ in pipes])
        for read_end, write_end in pipes:
            os.close(read_end)
            os.close(write_end)
        theirs.settimeout(10)
        assert b"".join(theirs.recv(64) for _ in range(3)) == b"111"
    assert _open_fds() - before == set()
    for name in ("output_0", "output_refresh", "output_recall"):
        outcome = compare_files._judged[name][1]
        assert isinstance(outcome, verify.EarlyVerdict) and outcome.verdict.guard == "output_tampering", name


def test_an_empty_record_does_not_stop_the_reading(tmp_path: Path) -> None:
    """An empty record reads like the child hanging up; the judge goes on reading at its next poll, so a
    child cannot park descriptors in the socket (the kernel's in-flight limit is per user, shared by every
    child) or hide a later output by sending one."""
    compare_files, files, ours, theirs = _stream(tmp_path)
    with verify.OutputStream(compare_files, files, exchange=ours) as stream:
        theirs.send(b"")
        time.sleep(0.1)
        _send(theirs, {"name": "output_0", "tensors": [{"dtype": "torch.float32", "shape": [8, 4]}]})
        theirs.settimeout(10)
        assert theirs.recv(64) == b"1"
        assert "output_0" not in stream.pending


def test_what_the_child_sent_last_is_judged_after_it_ended(tmp_path: Path) -> None:
    """The stream stops once the child is done; messages still in the socket are taken then, not left
    for the files pass, where their output would read as missing."""
    compare_files, files, ours, theirs = _stream(tmp_path)
    stream = verify.OutputStream(compare_files, files, exchange=ours)
    _send(theirs, {"name": "output_timed_0", "tensors": [{"dtype": "torch.float32", "shape": [2]}]})
    theirs.close()
    stream._stop.set()  # stopped before it ever polled
    with stream:
        pass
    assert "output_timed_0" in compare_files._judged


def test_a_sender_waits_for_room_only_while_the_judge_answers() -> None:
    """The child's end: with one output in flight it waits for the judge's acknowledgement before the
    next, and goes on after ``wait_s`` or once the judge's end is gone."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sender = device_exchange.Sender(theirs, min_bytes=1, in_flight=1, wait_s=0.3, device=torch.device("cuda", 0))
    sender._unacknowledged = 1
    started = time.monotonic()
    sender._wait_for_room()
    assert 0.25 < time.monotonic() - started < 5  # the judge is late: it goes on
    ours.send(b"1")
    sender._wait_for_room()
    assert sender._unacknowledged == 0
    ours.send(b"1" * 10)  # more acknowledgements than outputs sent (forged messages got some)
    sender._unacknowledged = 1
    sender._wait_for_room()
    assert sender._unacknowledged == 0  # never below: the next output still waits its turn
    sender._unacknowledged = 1
    started = time.monotonic()
    sender._wait_for_room()
    assert time.monotonic() - started > 0.25
    sender._unacknowledged = 1
    ours.close()
    started = time.monotonic()
    sender._wait_for_room()
    assert time.monotonic() - started < 0.2  # the judge is gone: no wait
    assert not sender.takes([torch.zeros(4)])  # host tensors are never sent
    assert "torch.float8_e4m3fn" not in device_exchange.SENT_DTYPES  # nor dtypes the judge does not take (checked on the GPU)


def test_a_groups_expected_outputs_are_loaded_once_for_all_its_judges(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every candidate's judge of a group asks for the same expected outputs: each is loaded (on a GPU,
    copied to the device) once, and let go when the group ends."""
    from concurrent.futures import ThreadPoolExecutor

    paths = [tmp_path / f"expected_{case}.pt" for case in range(3)]
    for path in paths:
        tensors.save(path, torch.randn(16))
    loads: list[Path] = []
    load = tensors.load

    def counted(path: Path, device: str = "cpu") -> object:
        loads.append(path)
        time.sleep(0.01)  # long enough for the judges to ask at once
        return load(path, device)

    monkeypatch.setattr(verify.tensors, "load", counted)
    group = verify.GroupExpected("cpu")
    with ThreadPoolExecutor(8) as judges:
        got = list(judges.map(group.get, paths * 8))
    assert sorted(loads) == sorted(paths)
    assert all(got[i] is got[i % 3] for i in range(len(got)))
    group.close()
    assert not group._loaded


def test_a_shortage_of_device_memory_is_not_blamed_on_the_candidate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver's answer decides: no memory to map or clone into is the worker's shortage (an
    out-of-memory verdict, which the worker runs again), a descriptor that will not map is tampering.
    The driver is stood in for here (no GPU on this machine); tests/test_device_exchange_gpu.py maps for real."""
    compare_files, files, _ours, _theirs = _stream(tmp_path)
    described = {"name": "output_0", "tensors": [{"dtype": "torch.float32", "shape": [4, 8]}]}
    answers: dict[str, Exception] = {
        "output_0": device_exchange.DeviceExchangeError("cuMemMap: out of memory", "CUDA_ERROR_OUT_OF_MEMORY"),
        "output_refresh": device_exchange.DeviceExchangeError("cuMemImportFromShareableHandle", "CUDA_ERROR_INVALID_VALUE"),
        "output_recall": device_exchange.DeviceExchangeError("cuMemMap", "CUDA_ERROR_INVALID_CONTEXT"),
        "output_knockout": TypeError("the memory is not where torch can use it"),
    }
    asked: list[int] = []

    def driver_says(fd: int, *_args: object, **_kwargs: object) -> torch.Tensor:
        asked.append(fd)
        raise answers[name]

    monkeypatch.setattr(device_exchange, "import_clone", driver_says)
    for name in answers:
        read_end, write_end = os.pipe()
        os.close(write_end)
        received = device_exchange.Received({**described, "name": name}, [read_end], truncated=False, empty=False)
        compare_files.consume_sent(name, received, files.expected(name), None)
        assert not received.fds
    short, lied, broken, unusable = (compare_files._judged[name][1] for name in answers)
    assert isinstance(short, verify.EarlyVerdict) and short.verdict.details.get("out_of_memory")
    assert short.verdict.status == "runtime_error"
    assert isinstance(lied, verify.EarlyVerdict) and lied.verdict.guard == "output_tampering"
    # the judge's own failure, or memory torch cannot use: that output is not judged, and the group's other
    # verdicts stand (this raised through the group before)
    for failed in (broken, unusable):
        assert isinstance(failed, verify.EarlyVerdict) and failed.verdict.status == "runtime_error"
        assert failed.verdict.guard is None and not failed.verdict.details.get("out_of_memory")
    assert len(asked) == len(answers)


def test_a_judge_whose_device_fails_even_a_sum_ends_its_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a failure that is not the sender's, the judge tries its device once more: a CUDA context lost to
    a sticky error would make every later comparison read "incorrect", so the process ends and its jobs run
    again (``unfit.declare``; in a process that runs no jobs, ``ProcessUnfit``). The check is stood in for here
    (no CUDA); tests/test_device_exchange_gpu.py loses a context for real."""
    compare_files, files, _ours, _theirs = _stream(tmp_path)
    compare_files.device = "cuda:0"
    monkeypatch.setattr(unfit, "_exits", False)  # a process that runs no jobs: it raises instead of ending
    monkeypatch.setattr(verify, "context_lost", lambda device: f"the CUDA context of {device} failed: {device} is gone")

    def torch_cannot_use_it(*_args: object, **_kwargs: object) -> torch.Tensor:
        raise TypeError("the memory is not where torch can use it")

    monkeypatch.setattr(device_exchange, "import_clone", torch_cannot_use_it)
    read_end, write_end = os.pipe()
    os.close(write_end)
    described = {"name": "output_0", "tensors": [{"dtype": "torch.float32", "shape": [4, 8]}]}
    received = device_exchange.Received(described, [read_end], truncated=False, empty=False)
    with pytest.raises(ProcessUnfit, match="the CUDA context of cuda:0 failed"):
        compare_files.consume_sent("output_0", received, files.expected("output_0"), None)
    assert not received.fds  # its descriptors closed all the same
