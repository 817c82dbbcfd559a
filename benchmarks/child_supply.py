"""How many warm evaluation children a worker's pool supplies per minute, and what a child's warm-up costs.

A child serves one job, so a GPU reward worker can finish at most as many evaluations (candidates
and references) per minute as its pool warms children: ``size / warm-up seconds``. Two figures:

- ``phases``: one warm-up's steps timed in a plain process (import torch, Triton, the rehearsed call,
  CUDA init, Triton's driver, the vendor libraries), ``N`` such processes at once (``--together``);
- ``supply``: the pool itself (sandboxed children, the worker's settings), ``--sizes`` warm children,
  drained as fast as it refills for ``--seconds``: children per minute, and how long a taken child
  still had to warm.

    python benchmarks/child_supply.py --device cuda --sizes 8 16 --together 1 8 --out child_supply.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

PHASES = r"""
import json, sys, time
marks = [("start", time.perf_counter())]
def mark(name): marks.append((name, time.perf_counter()))
import torch; mark("import torch")
import triton; mark("import triton")
from reward_svc.harness.child import _rehearse_a_recorded_call, _warm_triton_driver, _warm_vendor_libraries
_rehearse_a_recorded_call(); mark("rehearsal")
device = sys.argv[1]
if device == "cuda":
    torch.cuda.init(); torch.empty(1, device="cuda"); mark("cuda init")
    _warm_triton_driver(); mark("triton driver")
    _warm_vendor_libraries(); mark("vendor libraries")
print(json.dumps({b[0]: round(b[1] - a[1], 3) for a, b in zip(marks, marks[1:])}))
"""


def warm_up_phases(device: str, together: int) -> dict[str, Any]:
    """``together`` plain processes warming up at once: each phase's median seconds, and the wall time."""
    started = time.perf_counter()
    processes = [
        subprocess.Popen([sys.executable, "-c", PHASES, device], stdout=subprocess.PIPE, text=True) for _ in range(together)
    ]
    runs = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in processes]
    wall = time.perf_counter() - started
    phases = {name: round(statistics.median(run[name] for run in runs), 3) for name in runs[0]}
    total = round(sum(phases.values()), 2)
    return {"together": together, "wall_s": round(wall, 2), "median_phase_s": phases, "median_total_s": total}


def pool_supply(device: str, size: int, seconds: float) -> dict[str, Any]:
    """Children per minute from a pool of ``size`` warm children drained as fast as it refills."""
    from reward_svc.evaluate import Evaluator
    from services.config import get_settings

    settings = get_settings().model_copy(update={"reward_warm_children": size})
    evaluator = Evaluator(settings)
    try:
        pool = evaluator.pool(device)
        warm_s = time.perf_counter()
        pool.wait_ready(timeout_s=600)
        warm_s = time.perf_counter() - warm_s
        waits: list[float] = []
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            taken = time.perf_counter()
            child = pool.take()  # returns it warm
            waits.append(time.perf_counter() - taken)
            child.discard()
        elapsed = time.perf_counter() - started
    finally:
        evaluator.close()
    return {
        "size": size,
        "first_fill_s": round(warm_s, 2),
        "children": len(waits),
        "children_per_min": round(len(waits) / elapsed * 60, 1),
        "wait_p50_s": round(statistics.median(waits), 3),
        "wait_max_s": round(max(waits), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    parser.add_argument("--sizes", type=int, nargs="+", default=[8], help="warm pool sizes to drain")
    parser.add_argument("--together", type=int, nargs="+", default=[1, 8], help="plain warm-ups run at once")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long each pool is drained")
    parser.add_argument("--out", type=Path, help="JSON report")
    args = parser.parse_args()

    report: dict[str, Any] = {"device": args.device, "phases": [], "supply": []}
    console = Console()
    for together in args.together:
        report["phases"].append(warm_up_phases(args.device, together))
        console.print(report["phases"][-1])
        _write(args.out, report)  # each figure as it comes: a step cut by its time limit keeps those done
    for size in args.sizes:
        report["supply"].append(pool_supply(args.device, size, args.seconds))
        console.print(report["supply"][-1])
        _write(args.out, report)
    columns = ("size", "first_fill_s", "children_per_min", "wait_p50_s", "wait_max_s")
    table = Table(*columns, title=f"pool supply ({args.device})")
    for row in report["supply"]:
        table.add_row(*(str(row[c]) for c in columns))
    console.print(table)


def _write(out: Path | None, report: dict[str, Any]) -> None:
    if out is not None:
        out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
