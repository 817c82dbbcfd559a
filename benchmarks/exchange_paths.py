"""What moving one trial output from a candidate's child to the judge costs on each path, on the GPU host.

- ``file``: today's path. The child copies the output to page-locked host memory and ``torch.save``s it into the
  scratch dir (a tmpfs); the judge copies the file into a memfd of its own, maps it and copies it to the device.
- ``file_pinned``: the judge's half read into page-locked host memory instead (one kernel copy), then a DMA.
- ``device_fd``: the output never leaves the device. The child copies it into an exportable allocation (CUDA's
  virtual memory management, ``cuMemCreate`` with a POSIX file descriptor handle), sends the descriptor over a
  Unix socket (``SCM_RIGHTS``: works across PID namespaces, where legacy CUDA IPC handles do not), and the judge
  imports, maps and clones it into memory of its own.

The producer runs as a plain process and in the platform's sandbox as a reward child does (its own PID namespace,
the NVIDIA nodes only), to show the descriptor path crosses the sandbox. Each path runs alone, then ``--parallel``
sandboxed producers at once (host memory bandwidth is shared; the device copies are not).

    python benchmarks/exchange_paths.py --gb 2 --parallel 8 --out gpu-results/exchange_paths.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reward_svc.verify import _load_output  # noqa: E402
from services.children import device_exchange, tensors  # noqa: E402
from services.sandbox import Confinement, SandboxProcess  # noqa: E402


def producer(path: str, sock_fd: int, gb: float, seed: int) -> None:
    """The child's half of every path, timed: the output made on the device, then sent each way."""
    torch.cuda.init()
    n = int(gb * (1 << 30)) // 4
    out = torch.randn(n, device="cuda", generator=torch.Generator("cuda").manual_seed(seed))
    torch.cuda.synchronize()
    sock = socket.socket(fileno=sock_fd)
    times: dict[str, float] = {}
    started = time.perf_counter()
    tensors.save(Path(path), out)
    times["file_write"] = time.perf_counter() - started
    started = time.perf_counter()
    exported = device_exchange.export(out)
    torch.cuda.synchronize()
    times["device_export"] = time.perf_counter() - started
    header = json.dumps({"nbytes": n * 4, "shape": [n], "times": times, "checksum": float(out.double().sum())}).encode()
    socket.send_fds(sock, [header], [exported.fd])
    sock.recv(1)  # the judge has its clone
    exported.close()


def _matches(t: torch.Tensor, checksum: float) -> bool:
    """Whether ``t`` is the producer's output, by the sum it sent along."""
    return abs(float(t.double().sum()) - checksum) < 1e-3 * max(1.0, abs(checksum))


def one_exchange(gb: float, seed: int, sandboxed: bool, scratch: Path) -> dict[str, Any]:
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    path = scratch / f"out_{seed}.pt"
    argv = [sys.executable, str(Path(__file__).resolve()), "produce", str(path), str(child.fileno()), str(gb), str(seed)]
    started = time.perf_counter()
    process: SandboxProcess | subprocess.Popen[bytes]
    if sandboxed:  # as a reward child is: the platform's sandbox, the NVIDIA nodes only, its own PID namespace
        confinement = Confinement(
            gpu=True,
            memory_bytes=None,
            writable_dirs=(scratch,),
            readonly_dirs=(Path(__file__).resolve().parent,),  # this script: not one of the checkout's packages
            env={"PYTHONPATH": os.pathsep.join(sys.path)},
        )
        process = SandboxProcess(argv, confinement, pass_fds=(child.fileno(),))
    else:
        process = subprocess.Popen(argv, pass_fds=[child.fileno()])
    child.close()
    message, fds, _, _ = socket.recv_fds(parent, 1 << 16, 1)
    sent_at = time.perf_counter()
    info = json.loads(message)
    row: dict[str, Any] = {"child": info["times"], "sandboxed": sandboxed}
    t0 = time.perf_counter()
    clone = device_exchange.import_clone(fds[0], torch.float32, info["shape"], 0)
    torch.cuda.synchronize()
    row["device_import_clone"] = time.perf_counter() - t0
    os.close(fds[0])
    row["device_ok"] = _matches(clone, info["checksum"])
    del clone
    parent.send(b"1")
    if isinstance(process, SandboxProcess):
        process.run(wall_timeout_s=120)
    else:
        process.wait()
    # the judge's half of the file path, today's (memfd, map, copy to the device) and read into pinned memory
    t0 = time.perf_counter()
    size = path.stat().st_size
    loaded = tensors.to_device(_load_output(path, size, private=True), "cuda")  # the judge's own read of a live child's file
    torch.cuda.synchronize()
    row["file_read_memfd_to_device"] = time.perf_counter() - t0
    ok_file = _matches(loaded, info["checksum"])
    del loaded
    fd = os.open(path, os.O_RDONLY)
    t0 = time.perf_counter()
    pinned = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    view = pinned.numpy().data
    got = 0
    while got < size:
        got += os.readv(fd, [view[got:]])
    row["file_read_pinned"] = time.perf_counter() - t0
    device_bytes = pinned.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    row["file_read_pinned_to_device"] = time.perf_counter() - t0
    del device_bytes, pinned
    os.close(fd)
    path.unlink()
    row["file_ok"] = ok_file
    row["wall"] = time.perf_counter() - started
    row["sent_after"] = sent_at - started
    return row


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "produce":
        producer(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=2.0)
    parser.add_argument("--parallel", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path("gpu-results/exchange_paths.json"))
    args = parser.parse_args()
    torch.cuda.init()
    torch.empty(1, device="cuda")
    scratch = Path(tempfile.mkdtemp(prefix="kz-exchange-", dir="/dev/shm"))
    rows: list[dict[str, Any]] = []
    for sandboxed in (False, True):
        for seed in range(2):
            row = {"run": "alone", **one_exchange(args.gb, seed, sandboxed, scratch)}
            print(json.dumps(row), flush=True)
            rows.append(row)
    results: list[dict[str, Any]] = []
    lock = threading.Lock()

    def run(seed: int) -> None:
        row = {"run": f"{args.parallel} at once", **one_exchange(args.gb, 100 + seed, True, scratch)}
        with lock:
            results.append(row)

    threads = [threading.Thread(target=run, args=(seed,)) for seed in range(args.parallel)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for row in results:
        print(json.dumps(row), flush=True)
    rows += results
    args.out.parent.mkdir(parents=True, exist_ok=True)
    summary = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(),
        "gb": args.gb,
        "parallel_wall_s": time.perf_counter() - started,
        "rows": rows,
    }
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
