"""``benchmarks/reward_load.py`` at a tiny scale, so it cannot rot: it starts the reward API and a CPU worker,
submits, waits for the job, and writes its JSON and plot."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from processes import leftovers
from services.config import Settings

BENCHMARK = Path(__file__).resolve().parents[1] / "benchmarks" / "reward_load.py"


@pytest.mark.slow
def test_reward_load_benchmark_runs_small(platform_env: Callable[..., Settings], redis_url: str, tmp_path: Path) -> None:
    platform_env()
    out, data_dir = tmp_path / "results" / "reward_load.json", tmp_path / "bench-data"
    run = subprocess.run(
        [sys.executable, str(BENCHMARK), "--requests", "60", "--clients", "6", "--distinct", "1"]
        + ["--redis-url", redis_url, "--data-dir", str(data_dir), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(out.read_text())
    submission, completion = report["submission"], report["completion"]
    assert submission["accepted"] == submission["requests"] == 60 and submission["status_codes"] == {"202": 60}
    assert submission["errors"] == {} and submission["latency_ms"]["p50"] > 0
    assert (completion["jobs"], completion["succeeded"], completion["unfinished"]) == (1, 1, 0)
    assert 0 < completion["latency_s"]["p50"] <= completion["last_finished_s"] + 1
    assert report["series"]["queue_depth"] and report["series"]["finished_at_s"]
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert leftovers(data_dir, set()) == []
