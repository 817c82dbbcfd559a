"""The judge's host comparison (``reward_svc.verify.compare``) of one output with its expected output,
by the size of the slices it works through (``tensors.HOST_SLICE_ELEMENTS``): the outputs up to
``HOST_JUDGE_MAX_BYTES`` are judged on the host, every trial's, so its speed is how long a candidate's
outputs wait for the judge. Slice sizes are interleaved run by run (load from other work hits them alike).

With ``--concurrent N``, N judge threads compare at once (as a GPU worker's groups do), under each of
``--threads`` torch intra-op thread counts (0: torch's default, one per core): how many threads a
worker's judges should use beside each other.

With ``--load``, how the judge reads an output file its child may still touch (``verify._load_output``,
private): the bytes read into Python and deserialised from there (the judge until 2026-12-04) against
the kernel's copy into an anonymous in-memory file, then mapped (since), for 250-MB and 1-GB files in
``--dir`` (default /dev/shm, the scratch dir's kind on GPU hosts).

Usage: .venv/bin/python benchmarks/judge_compare.py [--runs 5] [--concurrent 8 --threads 1,2,4,0 | --load] [--out FILE]
Writes benchmarks/results/judge_compare_cpu.json (judge_load_cpu.json with --load) unless --out says otherwise.
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import os
import platform
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reward_svc.verify import Tolerance, _load_output, compare  # noqa: E402
from services.children import tensors  # noqa: E402

RESULT = Path(__file__).resolve().parent / "results" / "judge_compare_cpu.json"
LOAD_RESULT = RESULT.with_name("judge_load_cpu.json")
LOAD_SIZES = {"250 MB": 250_000_000, "1 GB": 1_000_000_000}
SHAPES = {"33 MB (1024 x 8192, a GEMM's)": (1024, 8192), "250 MB (16 x 32 x 31 x 63 x 63, a 3-d conv's)": (16, 32, 31, 63, 63)}
SLICES = {
    "2^24 (the device's)": 1 << 24,
    f"2^{tensors.HOST_SLICE_ELEMENTS.bit_length() - 1} (the host's)": tensors.HOST_SLICE_ELEMENTS,
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--concurrent", type=int, default=0, help="judge threads at once (0: the slice comparison instead)")
    parser.add_argument("--threads", default="1,2,4,0", help="torch intra-op threads to try (0: torch's default)")
    parser.add_argument("--load", action="store_true", help="time reading an output file instead of comparing")
    parser.add_argument("--dir", type=Path, default=Path("/dev/shm"), help="where --load writes its files")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.manual_seed(0)
    tolerance = Tolerance(1e-4, 1e-4)
    default_threads = torch.get_num_threads()
    if args.load:
        rows = load_rows(args.runs, args.dir)
        title, columns = "an output file read by the judge", ("output", "way", "median s")
        cells = [(r["output"], r["way"], f"{r['median_s']:.3f}") for r in rows]
    elif args.concurrent:
        rows = concurrent_rows(
            args.concurrent, [int(t) or default_threads for t in args.threads.split(",")], args.runs, tolerance
        )
        title, columns = (
            f"{args.concurrent} judges at once, 33-MB outputs",
            ("torch threads", "per comparison, median s", "comparisons/s"),
        )
        cells = [(str(r["torch_threads"]), f"{r['median_s']:.3f}", f"{r['per_second']:.1f}") for r in rows]
    else:
        rows = slice_rows(args.runs, tolerance)
        title, columns = "verify.compare on the host", ("output", "slice", "median s")
        cells = [(r["output"], r["slice"], f"{r['median_s']:.3f}") for r in rows]
    report = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "torch_threads": default_threads, "python": platform.python_version()},
        "concurrent": args.concurrent,
        "load": args.load,
        "load_average": os.getloadavg(),
        "rows": rows,
    }
    table = Table(title=title)
    for column in columns:
        table.add_column(column)
    for cell in cells:
        table.add_row(*cell)
    Console().print(table)
    (args.out or (LOAD_RESULT if args.load else RESULT)).write_text(json.dumps(report, indent=2))


def concurrent_rows(judges: int, thread_counts: list[int], runs: int, tolerance: Tolerance) -> list[dict[str, object]]:
    """Each thread count in turn, ``runs`` rounds of ``judges`` comparisons started together."""
    pairs = []
    for _ in range(judges):
        expected = torch.randn(SHAPES["33 MB (1024 x 8192, a GEMM's)"])
        pairs.append((expected + 1e-6 * torch.randn_like(expected), expected))

    def judge(pair: tuple[torch.Tensor, torch.Tensor]) -> float:
        started = time.perf_counter()
        assert compare(*pair, tolerance).ok
        return time.perf_counter() - started

    rows: list[dict[str, object]] = []
    with ThreadPoolExecutor(judges) as pool:
        for threads in thread_counts:
            torch.set_num_threads(threads)
            seconds: list[float] = []
            started = time.perf_counter()
            for _ in range(runs):
                seconds += pool.map(judge, pairs)
            wall = time.perf_counter() - started
            rows.append(
                {
                    "torch_threads": threads,
                    "median_s": round(statistics.median(seconds), 3),
                    "per_second": round(len(seconds) / wall, 2),
                }
            )
    return rows


def load_rows(runs: int, directory: Path) -> list[dict[str, object]]:
    """Both ways in turn on the same file, ``runs`` times per size; each result checked equal."""

    def read_into_python(path: Path, max_bytes: int) -> object:
        with path.open("rb") as handle:
            return torch.load(io.BytesIO(handle.read(max_bytes + 1)), map_location="cpu", weights_only=True)

    ways = {
        "read into Python, deserialised": read_into_python,
        "private in-memory copy, mapped": functools.partial(_load_output, private=True),
    }
    rows: list[dict[str, object]] = []
    for size_name, nbytes in LOAD_SIZES.items():
        path = directory / f"kz_judge_load_{nbytes}.pt"
        tensors.save(path, torch.randn(nbytes // 4))
        try:
            seconds: dict[str, list[float]] = {way: [] for way in ways}
            for _ in range(runs):
                loaded = []
                for way, load in ways.items():
                    started = time.perf_counter()
                    loaded.append(load(path, path.stat().st_size))
                    seconds[way].append(time.perf_counter() - started)
                assert torch.equal(*loaded)
                del loaded
        finally:
            path.unlink()
        rows += [
            {"output": size_name, "way": way, "median_s": round(statistics.median(t), 3), "runs_s": t}
            for way, t in seconds.items()
        ]
    return rows


def slice_rows(runs: int, tolerance: Tolerance) -> list[dict[str, object]]:
    host_slice = tensors.HOST_SLICE_ELEMENTS
    rows: list[dict[str, object]] = []
    for shape_name, shape in SHAPES.items():
        expected = torch.randn(shape)
        output = expected + 1e-6 * torch.randn_like(expected)
        seconds: dict[str, list[float]] = {name: [] for name in SLICES}
        for _ in range(runs):
            for name, elements in SLICES.items():
                tensors.HOST_SLICE_ELEMENTS = elements
                started = time.perf_counter()
                comparison = compare(output, expected, tolerance)
                seconds[name].append(time.perf_counter() - started)
                assert comparison.ok, comparison.why
        tensors.HOST_SLICE_ELEMENTS = host_slice
        rows += [
            {"output": shape_name, "slice": name, "median_s": round(statistics.median(times), 3), "runs_s": times}
            for name, times in seconds.items()
        ]
    return rows


if __name__ == "__main__":
    main()
