"""``benchmarks/trial_profile.py`` on the CPU: one problem's reference and candidate harness runs, each
profiled in a process of its own, report their phases and the ops that took their time."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_problem_is_profiled_on_both_sides(tmp_path: Path) -> None:
    problems, candidates = tmp_path / "problems", tmp_path / "candidates"
    problems.mkdir()
    candidates.mkdir()
    shutil.copy(ROOT / "tests/kernels/relu/reference.py", problems / "1_relu.py")
    shutil.copy(ROOT / "tests/kernels/relu/triton_correct.py", candidates / "1_relu.py")
    out = tmp_path / "trial_profile.json"
    # paths as a user types them, relative to where the command runs (each side runs in its own work dir)
    command = [sys.executable, str(ROOT / "benchmarks/trial_profile.py"), "run", "--problems", "problems"]
    command += ["--candidates", "candidates", "--only", "1_", "--device", "cpu", "--out", str(out)]
    subprocess.run(command, check=True, capture_output=True, timeout=300, cwd=tmp_path)
    [row] = json.loads(out.read_text())["rows"]
    assert row["problem"] == "1_relu.py"
    for side in ("reference", "candidate"):
        profiled = row["sides"][side]
        assert profiled["status"] == "ok" and profiled["phases"]["trials"] > 0
        assert profiled["clock"] == "cpu" and profiled["total_ms"] > 0
        assert profiled["top"] and all(op["ms"] > 0 and op["calls"] > 0 for op in profiled["top"])
    # the candidate's harness fingerprints its outputs (integer products and sums): they are in its profile
    assert {"aten::mul", "aten::sum"} <= {op["op"] for op in row["sides"]["candidate"]["top"]}
