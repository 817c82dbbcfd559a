"""The judge's host comparison (``reward_svc.verify.compare``) of one output with its expected output,
by the size of the slices it works through (``tensors.HOST_SLICE_ELEMENTS``): the outputs up to
``HOST_JUDGE_MAX_BYTES`` are judged on the host, every trial's, so its speed is how long a candidate's
outputs wait for the judge. Slice sizes are interleaved run by run (load from other work hits them alike).

Usage: .venv/bin/python benchmarks/judge_compare.py [--runs 5]
Writes benchmarks/results/judge_compare_cpu.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reward_svc.verify import Tolerance, compare  # noqa: E402
from services.children import tensors  # noqa: E402

RESULT = Path(__file__).resolve().parent / "results" / "judge_compare_cpu.json"
SHAPES = {"33 MB (1024 x 8192, a GEMM's)": (1024, 8192), "250 MB (16 x 32 x 31 x 63 x 63, a 3-d conv's)": (16, 32, 31, 63, 63)}
SLICES = {
    "2^24 (the device's)": 1 << 24,
    f"2^{tensors.HOST_SLICE_ELEMENTS.bit_length() - 1} (the host's)": tensors.HOST_SLICE_ELEMENTS,
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    tolerance = Tolerance(1e-4, 1e-4)
    host_slice = tensors.HOST_SLICE_ELEMENTS
    rows = []
    for shape_name, shape in SHAPES.items():
        expected = torch.randn(shape)
        output = expected + 1e-6 * torch.randn_like(expected)
        seconds: dict[str, list[float]] = {name: [] for name in SLICES}
        for _ in range(args.runs):
            for name, elements in SLICES.items():
                tensors.HOST_SLICE_ELEMENTS = elements
                started = time.perf_counter()
                comparison = compare(output, expected, tolerance)
                seconds[name].append(time.perf_counter() - started)
                assert comparison.ok, comparison.why
        tensors.HOST_SLICE_ELEMENTS = host_slice
        rows += [
            {"output": shape_name, "slice": name, "median_s": round(statistics.median(runs), 3), "runs_s": runs}
            for name, runs in seconds.items()
        ]
    report = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "python": platform.python_version()},
        "load_average": os.getloadavg(),
        "rows": rows,
    }
    table = Table(title="verify.compare on the host")
    for column in ("output", "slice", "median s"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["output"], row["slice"], f"{row['median_s']:.3f}")
    Console().print(table)
    RESULT.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
