"""Per-evaluation cost of the sandbox on this machine: the same commands run directly and sandboxed.

Every evaluation starts a sandboxed child, so this overhead is paid once per candidate. "direct"
is a plain subprocess with captured output and a clean environment (what any runner pays);
each isolation mode is timed around ``run_sandboxed``. The ways of running one command are
interleaved run by run, so load from other work on the machine hits them alike (the load
average is recorded too). The "warm" rows time only ``run()`` of a child started beforehand
and blocked on stdin, as a pool of warm children would use it.

Usage: .venv/bin/python benchmarks/sandbox_overhead.py [--runs 30]
Writes benchmarks/results/sandbox_overhead_cpu.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.sandbox import Confinement, SandboxProcess, run_sandboxed  # noqa: E402
from services.sandbox.bwrap import bwrap_probe  # noqa: E402

RESULT = Path(__file__).resolve().parent / "results" / "sandbox_overhead_cpu.json"
COMMANDS = {"/bin/true": ["/bin/true"], "python -c pass": [sys.executable, "-c", "pass"]}
WARM_CHILD = [sys.executable, "-c", "import sys; sys.stdin.read()"]
POLICY = Confinement(wall_timeout_s=60)
CLEAN_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


def interleaved(ways: dict[str, Callable[[], object]], runs: int) -> dict[str, list[float]]:
    """Wall milliseconds of ``runs`` calls of each way, taken in turns after one warm-up each."""
    samples: dict[str, list[float]] = {name: [] for name in ways}
    for round_ in range(runs + 1):
        for name, fn in ways.items():
            start = time.perf_counter()
            fn()
            if round_:
                samples[name].append((time.perf_counter() - start) * 1e3)
    return samples


def in_mode(mode: str, fn: Callable[[], object]) -> Callable[[], object]:
    def call() -> object:
        os.environ["KZ_SANDBOX"] = mode
        return fn()

    return call


def direct(argv: list[str]) -> None:
    subprocess.run(argv, env=CLEAN_ENV, capture_output=True, check=True)


def sandboxed(argv: list[str]) -> None:
    result = run_sandboxed(argv, POLICY)
    if result.returncode != 0:
        raise RuntimeError(f"{argv}: {result.describe()}: {result.stderr[-500:]!r}")


def warm_runs(modes: list[str], runs: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {mode: [] for mode in modes}
    for round_ in range(runs + 1):
        for mode in modes:
            os.environ["KZ_SANDBOX"] = mode
            proc = SandboxProcess(WARM_CHILD, POLICY)
            time.sleep(0.15)  # let the interpreter start and block on stdin
            start = time.perf_counter()
            result = proc.run(b"job")
            if round_:
                samples[mode].append((time.perf_counter() - start) * 1e3)
            if result.returncode != 0:
                raise RuntimeError(result.describe())
    return samples


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median_ms": round(statistics.median(ordered), 2),
        "p90_ms": round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], 2),
        "min_ms": round(ordered[0], 2),
        "runs": len(ordered),
    }


def machine() -> dict[str, object]:
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    bwrap = shutil.which("bwrap")
    bwrap_version = subprocess.run([bwrap, "--version"], capture_output=True, text=True).stdout.strip() if bwrap else None
    return {
        "hostname": socket.gethostname(),
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "bwrap": bwrap_version,
        "euid": os.geteuid(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()

    modes = ["fallback"] + (["bwrap"] if bwrap_probe()[0] else [])
    load_before = os.getloadavg()
    rows: list[dict[str, object]] = []
    for name, argv in COMMANDS.items():
        ways = {"direct": lambda argv=argv: direct(argv)}
        ways |= {mode: in_mode(mode, lambda argv=argv: sandboxed(argv)) for mode in modes}
        samples = interleaved(ways, args.runs)
        base = summary(samples["direct"])
        for how, times in samples.items():
            stats = summary(times)
            rows.append(
                {"command": name, "how": how, **stats, "overhead_median_ms": round(stats["median_ms"] - base["median_ms"], 2)}
            )
    for mode, times in warm_runs(modes, args.runs).items():
        rows.append({"command": "python, warm child: run() only", "how": mode, **summary(times)})

    table = Table(title=f"Sandbox overhead per evaluation ({args.runs} runs each, wall ms)")
    for column in ("command", "how", "median", "p90", "min", "overhead (median)"):
        table.add_column(column, justify="left" if column in ("command", "how") else "right")
    for row in rows:
        overhead = row.get("overhead_median_ms")
        table.add_row(
            str(row["command"]),
            str(row["how"]),
            f"{row['median_ms']:.2f}",
            f"{row['p90_ms']:.2f}",
            f"{row['min_ms']:.2f}",
            "" if overhead is None else f"{overhead:+.2f}",
        )
    Console().print(table)

    RESULT.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "load_average_1_5_15": {"before": load_before, "after": os.getloadavg()},
        "results": rows,
    }
    RESULT.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {RESULT}")


if __name__ == "__main__":
    main()
