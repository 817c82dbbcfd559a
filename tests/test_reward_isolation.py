"""What an evaluation child can see and leave behind, and what the judge reads of what it leaves:
settings sources and host files out of sight, no writable or shared locks directory, its own inbox
and build only, artefacts-only publishing, results signed, output files read safely."""

from __future__ import annotations

import functools
import json
import os
import pickle
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from reward_svc import verify
from reward_svc.build_cache import BuildCache, artefacts
from reward_svc.redact import Redactor
from reward_svc.shared_builds import HARNESS_CHILD
from services.children import tensors
from services.children.device import DeviceLock, gpu_lock
from services.children.layout import Layout
from services.children.pool import FORGED_RESULT, ChildPool
from services.children.report import OversizedFile
from services.children.tensor_files import MAX_DEPTH, MAX_DIMS, MAX_PICKLE_BYTES, MAX_TENSORS, ForeignFile
from services.config import Settings
from services.sandbox import run_sandboxed
from services.sandbox.bwrap import bwrap_probe
from services.schemas.reward import Verdict

REPO = Path(__file__).resolve().parents[1]
needs_bwrap = pytest.mark.skipif(bwrap_probe()[0] is None, reason="what a child sees is bwrap's to decide")


@needs_bwrap
def test_a_child_sees_its_own_dirs_and_the_system_and_nothing_else(kz_env: Callable[..., Settings], tmp_path: Path) -> None:
    """No settings source (the worker's .env beside it, the checkout's files), no host secrets or other
    checkouts, no locks dir, no other child's work, inbox or build, no exchange dir of other groups."""
    scratch = Path(tempfile.mkdtemp(dir="/var/tmp"))  # not under /tmp, which a child's private /tmp would hide anyway
    settings = kz_env(reward_warm_children=0, reward_scratch_dir=scratch, sandbox="bwrap")
    Path(".env").write_text("KZ_API_KEY=kz-canary-settings\n")
    layout = Layout(settings.data_dir / "reward", scratch=settings.reward_scratch_dir).create()
    pool = ChildPool(settings, layout, "cpu", 30.0, size=0, entry=HARNESS_CHILD)
    try:
        mine, other = (_child_dirs(layout, name) for name in ("mine", "other"))
        (other.workdir / "expected_0.pt").write_text("the reference's answer")
        (layout.exchange / "group").mkdir()
        (layout.exchange / "group" / "inputs_0.pt").write_text("another group's inputs")
        build = layout.cache / ("0" * 64)
        build.mkdir()
        (build / "lib.so").write_text("another source's build")
        Path(layout.gpu_lock("cuda")).touch()
        settings.api_key_file.write_text("kz-canary-local-key")
        probes = {
            "own work dir": str(mine.workdir),
            "own inbox": str(mine.inbox),
            "own build inbox": str(mine.build_inbox),
            "worker's .env": str(Path(".env").resolve()),
            "checkout README": str(REPO / "README.md"),
            "checkout .git": str(REPO / ".git"),
            "shadow": "/etc/shadow",
            "other work dir": str(other.workdir),
            "other inbox": str(other.inbox),
            "exchange": str(layout.exchange),
            "cache": str(build),
            "locks": str(layout.locks),
            "local API key": str(settings.api_key_file),
            "var": "/var/lib",
            "srv": "/srv",
        }
        code = "import json, os, sys; print(json.dumps({k: os.path.exists(v) for k, v in json.loads(sys.argv[1]).items()}))"
        result = run_sandboxed(
            [sys.executable, "-c", code, json.dumps(probes)], pool.confinement(mine.workdir, mine.inbox, mine.build_inbox)
        )
        seen = json.loads(result.stdout)
        assert {k for k, v in seen.items() if v} == {"own work dir", "own inbox", "own build inbox"}, result.stderr.decode()
        assert str(layout.locks) not in map(str, pool.confinement(mine.workdir).writable_dirs)
    finally:
        pool.close()
        shutil.rmtree(scratch)


def test_device_lock_descriptors_exclude_one_another(tmp_path: Path) -> None:
    """Each child holds the lock as read-only descriptors its pool opened: an exclusive hold through
    one waits for a shared hold through another, as with the lock file's path."""
    path = str(tmp_path / "gpu.lock")
    first, second = DeviceLock.open(path), DeviceLock.open(path)
    order: list[str] = []

    def timing() -> None:
        with gpu_lock(second.to_json(), exclusive=True):
            order.append("timed")

    try:
        with gpu_lock(first.to_json()):
            waiter = threading.Thread(target=timing)
            waiter.start()
            time.sleep(0.3)
            order.append("shared released")
        waiter.join(5)
        assert order == ["shared released", "timed"]
        assert os.get_blocking(first.lock_fd) and (os.stat(path).st_size == 0)  # read-only: nothing is ever written to it
    finally:
        first.close()
        second.close()


def test_only_the_artefacts_a_build_makes_are_published(tmp_path: Path) -> None:
    """A child's build dir may hold anything the candidate left there: only regular files of the
    harness's artefact kinds go into the cache, within their size bounds."""
    build = tmp_path / "build"
    (build / "triton" / "abc").mkdir(parents=True)
    (build / "kz_1234").mkdir()
    (build / "kz_1234" / "relu.so").write_bytes(b"\x7fELF")
    (build / "kz_1234" / "meta.json").write_text("{}")
    (build / "triton" / "abc" / "relu.cubin").write_bytes(b"cubin")
    (build / "junk.bin").write_bytes(b"x" * (1 << 20))  # 64 MiB of this stayed in the cache before
    (build / "payload.sh").write_text("#!/bin/sh\n")
    os.symlink("/etc/passwd", build / "kz_1234" / "linked.so")
    os.mkfifo(build / "triton" / "abc" / "fifo.json")
    kept = sorted(str(p.relative_to(build)) for p in artefacts(build))
    assert kept == ["kz_1234/meta.json", "kz_1234/relu.so", "triton/abc/relu.cubin"]
    cache = BuildCache(tmp_path / "cache", max_bytes=1 << 30)
    cache.root.mkdir()
    cache.publish(build, "src")
    published = sorted(str(p.relative_to(cache.path_for("src"))) for p in cache.path_for("src").rglob("*") if p.is_file())
    assert published == kept


CHILD_FROM_A_RELATIVE_INTERPRETER = """
import sys
from pathlib import Path
from reward_svc.shared_builds import HARNESS_CHILD
from services.children.layout import Layout
from services.children.pool import ChildPool
from services.config import Settings

settings = Settings(data_dir=Path(sys.argv[1]), reward_warm_children=0)
pool = ChildPool(settings, Layout(settings.data_dir / "reward").create(), "cpu", 60.0, size=0, entry=HARNESS_CHILD)
try:
    print(sys.executable, pool.take().wait_ready(60))
finally:
    pool.close()
"""


def test_children_start_for_an_interpreter_found_through_a_relative_path(tmp_path: Path) -> None:
    """``PATH=.venv/bin:$PATH python ...`` makes ``sys.executable`` relative; a child starts in its work dir."""
    venv_bin = Path(sys.executable).parent
    env = dict(os.environ, PATH=f"{venv_bin.name}{os.pathsep}{os.environ['PATH']}")
    ran = subprocess.run(
        ["python", "-c", CHILD_FROM_A_RELATIVE_INTERPRETER, str(tmp_path)],
        cwd=venv_bin.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert ran.stdout.split() == [f"{venv_bin.name}/python", "True"]


def test_a_result_file_the_harness_did_not_sign_is_a_forgery(kz_env: Callable[..., Settings]) -> None:
    """A child's result is signed with a key its job carried; one written by anything else in the child
    (native code that found the work dir writable) is recognised, whatever it claims."""
    settings = kz_env(reward_warm_children=0)
    layout = Layout(settings.data_dir / "reward").create()
    pool = ChildPool(settings, layout, "cpu", 30.0, size=0, entry="forging_child")
    try:
        child = pool.take()
        _, result = child.run({"claim": {"status": "correct"}})
        child.discard()
        assert result == FORGED_RESULT
    finally:
        pool.close()


@pytest.mark.parametrize(
    ("file", "plant"), [("result.json", "fifo"), ("result.json", "link"), ("audit.log", "fifo"), ("audit.log", "link")]
)
def test_a_childs_result_and_audit_log_are_read_without_following_or_blocking(
    kz_env: Callable[..., Settings], tmp_path: Path, file: str, plant: str
) -> None:
    """A result file or audit log made a FIFO (the worker once blocked on it for ever) or a link to a
    file of the host's (whose lines came back in the verdict's reason): the result is no result, and the
    audit lines are read through the descriptor the worker opened, whatever the child's name for them."""
    canary = tmp_path / "host-secret"
    canary.write_text("kz-host-canary-41d9\n" * 4)
    settings = kz_env(reward_warm_children=0)
    pool = ChildPool(settings, Layout(settings.data_dir / "reward").create(), "cpu", 30.0, size=0, entry="planting_child")
    try:
        child = pool.take()
        started = time.monotonic()
        _, result = child.run({"file": file, "plant": plant, "to": "/dev/zero" if file == "result.json" else str(canary)})
        child.discard()
    finally:
        pool.close()
    assert time.monotonic() - started < 20
    assert result is None
    assert child.audit == "gc.get_objects: refused after the swap\n"


def _child_dirs(layout: Layout, name: str) -> Any:
    """A child's three dirs as its pool makes them (without starting it)."""
    from types import SimpleNamespace

    dirs = SimpleNamespace(workdir=layout.jobs / name, inbox=layout.jobs / f"{name}.in", build_inbox=layout.build_inboxes / name)
    for path in vars(dirs).values():
        path.mkdir(parents=True)
    return dirs


def _judge_with(tmp_path: Path, plant: Callable[[Path], None]) -> Verdict:
    ref_dir, cand_dir = tmp_path / "ref", tmp_path / "cand"
    ref_dir.mkdir(), cand_dir.mkdir()
    tensors.save(ref_dir / "expected_0.pt", torch.randn(64))
    plant(cand_dir / "output_refresh.pt")  # one case, the knockout case: its clean run is the refresh
    compare_files = verify.FileComparer(verify.Tolerance())
    return verify.judge(
        {"status": "ok", "cases": 1},
        {"status": "ok", "observations": {"launches_per_case": [1]}},
        verify.TrialFiles(cand_dir, ref_dir, 1),
        compare_files,
    )


def test_a_tree_deeper_than_python_recurses_is_swept_and_a_worker_still_starts(tmp_path: Path) -> None:
    """A candidate can leave a directory 1,200 levels deep in its work dir: ``shutil.rmtree`` raised
    RecursionError there (past ``ignore_errors``), losing the group's verdicts at its child's discard and,
    the tree left behind, failing every later worker start in its sweep of dead owners' dirs."""
    layout = Layout(tmp_path / "reward").create()
    orphan = layout.jobs / "4194304.1-child"  # an owner pid past the kernel's largest: gone
    orphan.mkdir()
    fd = os.open(orphan, os.O_RDONLY)
    for _ in range(1200):  # by descriptor: a path this deep is past what Path.mkdir's recursion takes
        os.mkdir("d", dir_fd=fd)
        deeper = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = deeper
    os.close(fd)
    try:
        Layout(tmp_path / "reward").create()  # the next worker's start sweeps it
        assert not orphan.exists()
    finally:  # left behind, it would break pytest's own removal of old temp dirs in later sessions
        subprocess.run(["rm", "-rf", "--", str(orphan)], check=False)


def test_an_output_published_as_a_fifo_gets_a_verdict_at_once(tmp_path: Path) -> None:
    started = time.monotonic()
    verdict = _judge_with(tmp_path, lambda path: os.mkfifo(path))
    assert time.monotonic() - started < 10
    assert verdict.status == "rejected" and verdict.guard == "output_tampering", verdict.reason


def test_an_output_linked_elsewhere_is_not_followed(tmp_path: Path) -> None:
    verdict = _judge_with(tmp_path, lambda path: os.symlink("/etc/hostname", path))
    assert verdict.status == "rejected" and verdict.guard == "output_tampering", verdict.reason


def test_an_output_far_larger_than_the_answer_is_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 32 KiB answer read as 2.66 GB of worker memory: the size is checked against the expected
    output's file before a byte is read."""
    read: list[str] = []
    load = tensors.load
    monkeypatch.setattr(
        verify.tensors, "load", lambda path, *args, **kwargs: read.append(str(path)) or load(path, *args, **kwargs)
    )
    big = torch.randn(4 << 20)  # 16 MiB where the answer is 256 bytes
    verdict = _judge_with(tmp_path, lambda path: tensors.save(path, big))
    assert verdict.status == "incorrect" and "not read" in verdict.reason, verdict.reason
    assert read == []


NOT_DENSE = {
    # densified unchecked, its index writes past the buffer in the judge's process (a far one: a segfault)
    "sparse, an index past its size": lambda: torch.sparse_coo_tensor(
        torch.tensor([[70]]), torch.tensor([1e30]), (64,), check_invariants=False
    ),
    "expanded, 1 KiB that reads as 4 GiB": lambda: torch.zeros(1).expand(1 << 30),
    "quantized": lambda: torch.quantize_per_tensor(torch.randn(64), 0.1, 0, torch.qint8),
}


@pytest.mark.parametrize("kind", sorted(NOT_DENSE))
def test_an_output_that_is_not_dense_memory_of_its_own_is_refused_before_it_is_read(tmp_path: Path, kind: str) -> None:
    """``torch.load(weights_only=True)`` rebuilds these from a file the candidate wrote; the harness never writes
    one (it saves each tensor's own storage), so the judge refuses them before a byte is touched."""
    verdict = _judge_with(tmp_path, lambda path: torch.save(NOT_DENSE[kind](), path))
    assert verdict.status == "rejected" and verdict.guard == "output_tampering", verdict.reason
    assert "unreadable" in verdict.reason


def _archive(path: Path, pickled: bytes, records: dict[str, bytes] | None = None) -> None:
    """A tensor file holding ``pickled`` as its data.pkl, written by torch's own zip writer (as ``save``'s is)."""
    writer = torch._C.PyTorchFileWriter(str(path))
    for name, data in {"data.pkl": pickled, "byteorder": sys.byteorder.encode(), **(records or {})}.items():
        writer.write_record(name, data, len(data))
    writer.write_end_of_file()


def _compressed(record: str, content: bytes) -> Callable[[Path], None]:
    """A tensor file whose ``record`` is ``content`` deflated and marked so in both of its zip headers: torch's
    writer stores every record, its reader inflates a deflated one whole."""

    def write(path: Path) -> None:
        packer = zlib.compressobj(9, zlib.DEFLATED, -15)  # raw deflate, as a zip holds it
        stream = packer.compress(content) + packer.flush()
        _archive(path, stream) if record == "data.pkl" else _archive(path, _pickled(None), {record: stream})
        blob = bytearray(path.read_bytes())
        at = struct.unpack_from("<Q", blob, len(blob) - 50)[0]  # the directory's offset, in torch's zip64 end record
        while at < len(blob) - 98:
            name_len, extra_len, comment_len = struct.unpack_from("<HHH", blob, at + 28)
            if blob[at + 46 : at + 46 + name_len].endswith(f"/{record}".encode()):
                local = struct.unpack_from("<I", blob, at + 42)[0]
                for method_at in (at + 10, local + 8):  # in the central entry, in the local header: method to sizes
                    struct.pack_into("<HHHIII", blob, method_at, 8, 0, 0, zlib.crc32(content), len(stream), len(content))
            at += 46 + name_len + extra_len + comment_len
        path.write_bytes(blob)

    return write


def _pickled(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=2)


def _shared_lists(n: int) -> bytes:
    """``[x, x]`` nested ``n`` times, the second ``x`` fetched from the pickle's memo each time: 2**n paths."""
    pickled = pickle.PROTO + b"\x02" + pickle.EMPTY_LIST + pickle.BINPUT + b"\x00"
    for level in range(1, n + 1):
        inner = pickle.BINGET + bytes([level - 1])
        pickled += pickle.EMPTY_LIST + pickle.MARK + inner + inner + pickle.APPENDS + pickle.BINPUT + bytes([level])
    return pickled + pickle.STOP


def _call(module: str, name: str, *args: bytes) -> bytes:
    """A pickle calling ``module.name`` with the pickled ``args``."""
    return (
        pickle.PROTO
        + b"\x02"
        + pickle.GLOBAL
        + f"{module}\n{name}\n".encode()
        + pickle.MARK
        + b"".join(args)
        + pickle.TUPLE
        + pickle.REDUCE
        + pickle.STOP
    )


def _argument(value: Any) -> bytes:
    return _pickled(value)[2:-1]  # its opcodes alone, without PROTO and STOP


def _walk_steps(obj: Any, seen: dict[int, int] | None = None) -> int:
    """The steps a walk of ``obj``'s lists (``tensors.map_tensors``) takes, counted without taking them."""
    seen = {} if seen is None else seen
    if id(obj) not in seen:
        seen[id(obj)] = 1 + sum(_walk_steps(item, seen) for item in obj) if isinstance(obj, list) else 1
    return seen[id(obj)]


def _foreign_byte_order(path: Path) -> None:
    """``save``'s file of one tensor, its byte order marked as the other one."""
    tensors.save(path, torch.arange(4, dtype=torch.int32))
    reader = torch._C.PyTorchFileReader(str(path))
    records = {"data/0": reader.get_record("data/0"), "byteorder": b"big" if sys.byteorder == "little" else b"little"}
    _archive(path, reader.get_record("data.pkl"), records)


def _writes(pickled: bytes) -> Callable[[Path], None]:
    return lambda path: _archive(path, pickled)


def _loaded(path: Path) -> Any:
    return torch.load(path, weights_only=True)


def _too_deep_to_walk(path: Path) -> bool:
    with pytest.raises(RecursionError):
        tensors.tensors_in(_loaded(path))
    return True


NESTED = pickle.PROTO + b"\x02" + pickle.EMPTY_LIST * 10_000 + pickle.APPEND * 9_999 + pickle.STOP
# Each: how to write a file of a few KiB that plain ``torch.load(weights_only=True)`` reads, and what reading it costs.
COSTLY: dict[str, tuple[Callable[[Path], None], Callable[[Path], bool]]] = {
    "lists shared through the memo: 2**20 paths, each level doubling them for 5 bytes": (
        _writes(_shared_lists(20)),
        lambda path: _walk_steps(_loaded(path)) == 2**21 - 1,
    ),
    "a bytearray: 16 MiB from a few bytes": (
        _writes(_call("builtins", "bytearray", _argument(16 << 20))),
        lambda path: len(_loaded(path)) == 16 << 20,
    ),
    "punycode: quadratic in its length": (
        _writes(_call("_codecs", "encode", _argument("\u0100" * 2000), _argument("punycode"))),
        lambda path: isinstance(_loaded(path), bytes),
    ),
    "a deflated data.pkl: 16 MiB in a few KiB": (
        _compressed("data.pkl", _pickled("x" * (16 << 20))),
        lambda path: len(_loaded(path)) == 16 << 20 and path.stat().st_size < 64 << 10,
    ),
    "a deflated version record, inflated as torch's reader opens the file": (
        _compressed("version", b"3" + b" " * (16 << 20)),
        lambda path: len(torch._C.PyTorchFileReader(str(path)).get_record("version")) > 16 << 20,
    ),
    "lists 10,000 deep": (_writes(NESTED), _too_deep_to_walk),
    "a foreign byte order: each storage swapped in place, its mapping copied page by page": (
        _foreign_byte_order,
        lambda path: not torch.equal(_loaded(path), torch.arange(4, dtype=torch.int32)),
    ),
}


@pytest.mark.parametrize("kind", sorted(COSTLY))
def test_a_costly_output_file_plain_torch_load_reads_is_refused_at_once(tmp_path: Path, kind: str) -> None:
    """``weights_only`` keeps a file's code out, not its cost: each of these is read by plain ``torch.load``, at
    the cost shown (in the judge's process, before ``load``'s own checks ran); the judge refuses each as a file
    ``save`` never writes, before torch reads it, within seconds."""
    write, costs = COSTLY[kind]
    write(tmp_path / "plain.pt")
    assert costs(tmp_path / "plain.pt")
    started = time.monotonic()
    verdict = _judge_with(tmp_path, write)
    assert time.monotonic() - started < 5
    assert verdict.status == "rejected" and verdict.guard == "output_tampering", verdict.reason
    assert "unreadable (ForeignFile)" in verdict.reason
    with pytest.raises(ForeignFile):
        tensors.load(tmp_path / "plain.pt")


NOT_SAVED = {  # refused for what save never writes, whatever they would cost
    "a storage class outside a persistent id": _pickled([torch.FloatStorage]),
    "a storage class called": _call("torch", "FloatStorage"),
    "a set": _pickled({1, 2}),
    "bytes": _pickled(b"bytes"),
    "a tuple held twice": _pickled((lambda t: [t, t])((1, 2))),
    f"lists {MAX_DEPTH + 1} deep": _pickled(functools.reduce(lambda inner, _: [inner], range(MAX_DEPTH), [])),
    "a data.pkl over the limit": _pickled("x" * MAX_PICKLE_BYTES),
    "a pickle that stops short": _pickled([1, 2])[:-1],
}


@pytest.mark.parametrize("kind", sorted(NOT_SAVED))
def test_a_file_save_never_writes_is_refused(tmp_path: Path, kind: str) -> None:
    _archive(tmp_path / "output.pt", NOT_SAVED[kind])
    with pytest.raises(ForeignFile):
        tensors.load(tmp_path / "output.pt")


PAST_THE_BOUNDS = {  # torch.save writes these; the judge's work on each grows with what the file holds, not its size
    f"a tensor of {MAX_DIMS + 1} dims (a contiguous copy costs dims squared)": lambda: torch.empty((1,) * (MAX_DIMS + 1)),
    f"one tensor {MAX_TENSORS + 1} times (2 bytes each in the pickle, a fingerprint each)": lambda: (
        [torch.ones(1)] * (MAX_TENSORS + 1)
    ),
    "a tensor keying a dict (no check looks at keys)": lambda: {torch.ones(1): 1},
}


@pytest.mark.parametrize("kind", sorted(PAST_THE_BOUNDS))
def test_a_file_past_the_judges_bounds_is_refused(tmp_path: Path, kind: str) -> None:
    torch.save(PAST_THE_BOUNDS[kind](), tmp_path / "output.pt")
    with pytest.raises(ForeignFile):
        tensors.load(tmp_path / "output.pt")


def test_an_output_read_while_its_child_runs_is_the_judges_own_copy(tmp_path: Path) -> None:
    """The judge maps a private copy of an output its child could still touch: rewriting or cutting the
    file after it was read changes nothing the judge holds, and a file that grew past what was checked
    is refused rather than read on."""
    path = tmp_path / "output_0.pt"
    answer = torch.arange(1 << 20, dtype=torch.float32)
    tensors.save(path, answer)
    read = verify._load_output(path, path.stat().st_size, private=True)
    tensors.save(path, torch.zeros(1 << 20))
    os.truncate(path, 100)
    assert torch.equal(read, answer)
    tensors.save(path, answer)
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(OversizedFile), verify._private_copy(fd, path.stat().st_size - 1, path):
            pass
    finally:
        os.close(fd)


def test_a_child_result_can_never_be_a_verdict_of_its_own_choosing(tmp_path: Path) -> None:
    verdict = verify.judge(
        {"status": "ok", "cases": 1},
        {"status": "correct", "reason": "trust me"},
        verify.TrialFiles(tmp_path, tmp_path, 1),
        verify.FileComparer(verify.Tolerance()),
    )
    assert verdict.status == "runtime_error" and not verdict.correct


def test_secrets_are_taken_out_of_reasons_and_details(kz_env: Callable[..., Settings]) -> None:
    Path(".env").write_text("KZ_CODER_OPENAI_API_KEY=sk-canary-from-dotenv\nOTHER=short\n")
    redactor = Redactor(kz_env(database_url="postgresql+psycopg://kz:pg-canary-password@db/kz"))
    verdict = Verdict(
        "runtime_error",
        "RuntimeError: sk-canary-from-dotenv " + "x" * 5000,
        details={"stderr_tail": "dsn postgresql+psycopg://kz:pg-canary-password@db/kz", "n": 3},
    )
    redactor.verdict(verdict)
    assert "sk-canary" not in verdict.reason and len(verdict.reason) <= 2001
    assert "pg-canary-password" not in json.dumps(verdict.details) and verdict.details["n"] == 3


# Unchecked by the policy (the harness is run directly), so it may walk the stack: a constructor that
# finds a case's inputs there could compute their answers with PyTorch where nothing is recorded.
FRAME_WALKING_CANDIDATE = """
import sys
import torch

class ModelNew(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(32, 40)
        self.seen, frame = [], sys._getframe(1)
        while frame is not None:
            for value in list(frame.f_locals.values()):
                if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) and v.shape == (48, 32) for v in value):
                    self.seen.append(frame.f_code.co_name)
            frame = frame.f_back

    def forward(self, x):
        if self.seen:
            raise RuntimeError("the constructor found a case's inputs in " + ", ".join(self.seen))
        return self.fc(x)
"""


def test_a_candidates_constructor_runs_before_any_case_inputs_exist(tmp_path: Path) -> None:
    """ModelNew is built before the first trial's device hold, outside the op recording, as its import
    runs: before that trial's inputs are loaded, so no case's values are in the process to be read."""
    (tmp_path / "candidate.py").write_text(FRAME_WALKING_CANDIDATE)
    # the reference's run, then the candidate's, in a process of their own (the audit hook stays there), as the
    # trial profiler runs them; the reference is a Linear on (48, 32) inputs
    command = [sys.executable, str(REPO / "benchmarks/trial_profile.py"), "one", str(REPO / "tests/attacks/ref_linear.py")]
    command += [str(tmp_path / "candidate.py"), str(tmp_path), "--device", "cpu"]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])["sides"]["candidate"]
    assert result["status"] == "ok", result["reason"]
    assert result["phases"]["model"] >= 0 and result["phases"]["trials"] > 0  # built outside the holds, then run
    # the trials phase by what ran in its holds (trial_profile.py reports each side's phases and trial holds)
    holds = result["trial_holds"]
    assert set(holds) == {"warm-up", "trial", "knockout", "refresh", "recall", "take"}
    assert sum(holds.values()) == pytest.approx(result["phases"]["trials"], abs=0.01 + 0.05 * result["phases"]["trials"])
