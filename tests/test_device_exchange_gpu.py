"""Device memory handed over as descriptors (services/children/device_exchange.py), from a sandboxed sender
to this process: what the judge gets is the sender's bytes, its own, and a sender's lie about them fails
cleanly, leaving this process's CUDA usable."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch

from services.children import device_exchange
from services.sandbox import Confinement, SandboxProcess

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]

SENDER = textwrap.dedent(
    """
    import socket, sys, torch
    from services.children import device_exchange
    sock = socket.socket(fileno=int(sys.argv[1]))
    out = torch.arange(1 << 20, dtype=torch.float32, device="cuda") * 0.5
    exported = device_exchange.export(out)
    torch.cuda.synchronize()
    shape = [1 << 20] if sys.argv[2] == "honest" else [1 << 26]  # a lie: 256 MiB claimed, 4 MiB made
    device_exchange.send(sock, {"name": "output_0", "tensors": [{"dtype": "float32", "shape": shape}]}, [exported.fd])
    exported.close()  # the receiver's descriptor keeps the memory
    sock.recv(1)
    """
)


def _run_sender(tmp_path: Path, mode: str) -> tuple[object, list[int], SandboxProcess]:
    """(the message a sandboxed sender sent, its descriptors, the sender)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    script = tmp_path / "sender.py"
    script.write_text(SENDER)
    repo = Path(__file__).resolve().parent.parent
    confinement = Confinement(gpu=True, memory_bytes=None, readonly_dirs=(tmp_path,), env={"PYTHONPATH": str(repo)})
    process = SandboxProcess([sys.executable, str(script), str(theirs.fileno()), mode], confinement, pass_fds=(theirs.fileno(),))
    theirs.close()
    ours.settimeout(120)
    received = device_exchange.receive(ours, 1)
    ours.send(b"1")
    ours.close()
    return received.message, received.fds, process


@pytest.mark.parametrize("fresh_thread", [False, True], ids=["this thread", "a thread new to CUDA"])
def test_a_sandboxed_childs_output_arrives_as_this_processs_own_copy(tmp_path: Path, fresh_thread: bool) -> None:
    """Also in a thread that has made no CUDA call yet, as a judge's may not have: the driver calls have no
    current context there until the exchange makes the device's primary context current."""
    message, fds, process = _run_sender(tmp_path, "honest")
    got: list[torch.Tensor | BaseException] = []

    def receive() -> None:
        try:
            got.append(device_exchange.import_clone(fds[0], torch.float32, message["tensors"][0]["shape"], 0))
        except BaseException as exc:
            got.append(exc)

    try:
        assert isinstance(message, dict) and message["name"] == "output_0" and len(fds) == 1
        if fresh_thread:
            thread = threading.Thread(target=receive)
            thread.start()
            thread.join(60)
        else:
            receive()
    finally:
        for fd in fds:
            os.close(fd)
        process.kill()
    expected = torch.arange(1 << 20, dtype=torch.float32, device="cuda") * 0.5
    assert len(got) == 1 and isinstance(got[0], torch.Tensor), got
    assert torch.equal(got[0], expected)  # and it outlives the sender


def test_a_sender_that_claims_more_bytes_than_it_made_is_refused_and_cuda_still_works(tmp_path: Path) -> None:
    message, fds, process = _run_sender(tmp_path, "lie")
    try:
        assert isinstance(message, dict)
        with pytest.raises(device_exchange.DeviceExchangeError) as refused:
            device_exchange.import_clone(fds[0], torch.float32, message["tensors"][0]["shape"], 0)
    finally:
        for fd in fds:
            os.close(fd)
        process.kill()
    assert refused.value.senders_fault, refused.value  # the judge calls it tampering, not its own failure
    assert float(torch.ones(4, device="cuda").sum()) == 4.0  # no sticky error in this process


def test_a_descriptor_that_is_not_device_memory_is_refused(tmp_path: Path) -> None:
    read_end, write_end = os.pipe()
    try:
        with pytest.raises(device_exchange.DeviceExchangeError) as refused:
            device_exchange.import_clone(read_end, torch.float32, [4], 0)
        print(f"a pipe's descriptor: {refused.value}")  # which error the driver gives (tampering or not)
        with open(tmp_path / "plain", "wb") as plain:
            plain.write(b"\0" * 4096)
        fd = os.open(tmp_path / "plain", os.O_RDONLY)
        try:
            with pytest.raises(device_exchange.DeviceExchangeError):
                device_exchange.import_clone(fd, torch.float32, [4], 0)
        finally:
            os.close(fd)
    finally:
        os.close(read_end)
        os.close(write_end)
    assert float(torch.ones(4, device="cuda").sum()) == 4.0


STICKY_ERROR = textwrap.dedent(
    """
    import torch, triton, triton.language as tl
    from reward_svc.verify import _device_still_works
    from services.queue.unfit import ProcessUnfit

    @triton.jit
    def store_far_away(p):
        tl.store(p + (1 << 40), 1.0)  # a terabyte past its allocation: an illegal address, sticky

    _device_still_works("cuda:0")  # a working context passes
    store_far_away[(1,)](torch.zeros(1, device="cuda"))
    try:
        _device_still_works("cuda:0")
    except ProcessUnfit as exc:
        print("unfit:", exc)
    """
)


def test_a_context_lost_to_a_sticky_error_is_found_by_the_judges_check(tmp_path: Path) -> None:
    """What ``verify._device_still_works`` rests on, in a process of its own (the error poisons it for good)."""
    script = tmp_path / "sticky.py"
    script.write_text(STICKY_ERROR)
    repo = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))},
    )
    assert "unfit: the CUDA context of cuda:0 failed" in done.stdout, done.stdout + done.stderr[-2000:]
