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


def test_a_message_the_judge_cannot_map_is_a_verdict_and_is_acknowledged(tmp_path: Path) -> None:
    compare_files, files, ours, theirs = _stream(tmp_path)
    before = _open_fds()
    with verify.OutputStream(compare_files, files, exchange=ours) as stream:
        _send(theirs, {"name": "output_0", "tensors": [{"dtype": "torch.float32", "shape": [4, 8, -1]}]})
        _send(theirs, {"name": "output_knockout", "tensors": [{"dtype": "torch.float16", "shape": [4, 8]}]})
        _send(theirs, {"name": "output_refresh", "tensors": [{"dtype": "torch.float32", "shape": [8, 4]}]})
        _send(theirs, {"name": "output_recall", "tensors": [{"dtype": "__import__('os')", "shape": [4, 8]}]})
        theirs.settimeout(10)
        acknowledged = b"".join(theirs.recv(64) for _ in range(4))
        assert not {"output_0", "output_knockout", "output_refresh", "output_recall"} & set(stream.pending)
    assert acknowledged == b"1111"
    assert _open_fds() - before == set()  # every descriptor that came with them is closed
    judged = compare_files._judged
    for name in ("output_0", "output_recall"):  # not a description of tensors at all
        outcome = judged[name][1]
        assert isinstance(outcome, verify.EarlyVerdict) and outcome.verdict.guard == "output_tampering", name
    # a description of the wrong tensors is judged as the same output in a file would be, unread
    assert judged["output_knockout"] == (
        None,
        verify.compare(torch.zeros(4, 8, dtype=torch.float16), torch.zeros(4, 8), verify.Tolerance()),
    )
    assert judged["output_refresh"] == (None, verify.compare(torch.zeros(8, 4), torch.zeros(4, 8), verify.Tolerance()))
    refresh = judged["output_refresh"][1]
    assert isinstance(refresh, verify.Comparison) and "has shape (8, 4), expected (4, 8)" in refresh.why


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
        time.sleep(0.5)
        theirs.setblocking(False)
        try:
            extra = theirs.recv(64)
        except BlockingIOError:
            extra = b""
    assert extra == b""  # nothing judged, nothing acknowledged
    assert _open_fds() - before == set()
    assert set(compare_files._judged) == {"output_0"}


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
    sender = device_exchange.Sender(theirs, min_bytes=1, in_flight=1, wait_s=0.3)
    sender._unacknowledged = 1
    started = time.monotonic()
    sender._wait_for_room()
    assert 0.25 < time.monotonic() - started < 5  # the judge is late: it goes on
    ours.send(b"1")
    sender._wait_for_room()
    assert sender._unacknowledged == 0
    sender._unacknowledged = 1
    ours.close()
    started = time.monotonic()
    sender._wait_for_room()
    assert time.monotonic() - started < 0.2  # the judge is gone: no wait
    assert not sender.takes([torch.zeros(4)])  # host tensors are never sent


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
