"""``kernelzero eval`` and ``kernelzero generate`` with the template generator, scored in the local
sandbox under the Triton interpreter: reports written, metrics consistent, an interrupted run resumed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from coder_svc.best_of_n import LocalScorer
from coder_svc.evaluation.harness import Harness, discover
from coder_svc.evaluation.report import write_report
from coder_svc.generators import build_generator
from processes import leftovers
from reward_svc.evaluate import Evaluator
from services.config import Settings
from services.llm.chat import Sampling
from services.schemas.reward import ScoreOptions

KERNELZERO = str(Path(sys.executable).with_name("kernelzero"))

HEADER = "import torch\nimport torch.nn as nn\n\n\n"
PROBLEMS = {
    "1_ReLU.py": HEADER
    + """class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(8, 256)]


def get_init_inputs():
    return []
""",
    "2_Softmax.py": HEADER
    + """class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.randn(8, 128)]


def get_init_inputs():
    return []
""",
    "3_Matmul.py": HEADER
    + """class Model(nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b)


def get_inputs():
    return [torch.randn(16, 32), torch.randn(32, 16)]


def get_init_inputs():
    return []
""",
}


@pytest.fixture
def problems(kz_env: Callable[..., Settings], tmp_path: Path) -> Path:
    kz_env(reward_warm_children=1)
    root = tmp_path / "problems"
    root.mkdir()
    for name, source in PROBLEMS.items():
        (root / name).write_text(source)
    return root


def _eval(problems: Path, out: Path, samples: int = 2) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            KERNELZERO,
            "eval",
            "--problems",
            str(problems),
            "--backend",
            "triton",
            "--samples",
            str(samples),
            "--model-backend",
            "template",
            "--device",
            "cpu",
            "--out",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
        start_new_session=True,
        # as a script's ``&`` starts it: SIGINT ignored (a shell without job control does that), which the CLI
        # must undo, or Ctrl-C and kill -INT would not reach it
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )


def _lines(out: Path) -> list[str]:
    path = out / "samples.jsonl"
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.slow
def test_ctrl_c_stops_the_run_at_once_and_keeps_what_was_scored(problems: Path, tmp_path: Path) -> None:
    """A researcher's Ctrl-C: the run ends without waiting for the problem being scored, whose
    sandboxed children (in their own sessions, out of the terminal's reach) are stopped with it and
    whose half-made verdict is not written; the samples already scored are kept for the resume."""
    (problems / "3_Matmul.py").unlink()
    # scored second: minutes of interpreted Triton, so the interrupt lands while its children run
    (problems / "2_Softmax.py").write_text(PROBLEMS["1_ReLU.py"].replace("torch.randn(8, 256)", "torch.randn(4096, 4096)"))
    out = tmp_path / "eval"
    run = _eval(problems, out, samples=1)
    try:
        deadline = time.monotonic() + 240
        while not _lines(out) and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(_lines(out)) == 1 and run.poll() is None, run.stderr.read() if run.poll() is not None else "no record"
        time.sleep(8)  # the second problem's reference and candidate children start
        assert len(leftovers(tmp_path / "data", set())) >= 3  # the CLI (by its KZ_DATA_DIR) and two children
        run.send_signal(signal.SIGINT)
        stdout, stderr = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert run.returncode == 130, stderr[-3000:]
    assert "interrupted: 1 scored samples kept" in " ".join(stderr.split())
    assert [json.loads(line)["problem"] for line in _lines(out)] == ["1_ReLU"]
    time.sleep(1)
    assert leftovers(tmp_path / "data", set()) == []


@pytest.mark.slow
def test_eval_reports_and_resumes(problems: Path, tmp_path: Path) -> None:
    out = tmp_path / "eval"
    first = _eval(problems, out)
    deadline = time.monotonic() + 240
    while len(_lines(out)) < 2 and first.poll() is None and time.monotonic() < deadline:  # the first problem is done
        time.sleep(0.05)
    if first.poll() is None:
        os.killpg(first.pid, signal.SIGKILL)  # interrupted mid-run
    first.wait()
    before = _lines(out)
    assert 2 <= len(before) < 6, "the run should have been cut short after its first problem"

    second = _eval(problems, out)
    stdout, stderr = second.communicate(timeout=300)
    assert second.returncode == 0, stderr[-3000:]
    after = _lines(out)
    assert after[: len(before)] == before  # finished samples were kept, not redone
    records = [json.loads(line) for line in after]
    assert sorted((r["problem"], r["sample"]) for r in records) == [
        (p, s) for p in ("1_ReLU", "2_Softmax", "3_Matmul") for s in (0, 1)
    ]

    summary = json.loads((out / "summary.json").read_text())
    by_problem = {r["problem"]: r for r in records}
    assert by_problem["1_ReLU"]["correct"] is True and by_problem["1_ReLU"]["kernel"]
    assert by_problem["3_Matmul"]["status"] == "declined" and by_problem["3_Matmul"]["reason"]
    assert by_problem["1_ReLU"]["seconds"]["candidate"] > 0 and by_problem["1_ReLU"]["phases"]["reference"]
    assert by_problem["1_ReLU"]["phases"]["candidate_trials"]["knockout"] > 0  # its trials by what ran in the holds
    assert by_problem["3_Matmul"]["seconds"] is None
    overall = summary["levels"]["all problems"]
    solved = {r["problem"] for r in records if r["correct"]}
    assert overall["solved"] == sorted(solved)
    assert overall["pass_at_k"]["1"] == pytest.approx(sum(r["correct"] for r in records) / 6)
    assert overall["pass_at_k"]["2"] == pytest.approx(len(solved) / 3)
    assert overall["fast_p"]["0.0"] == pytest.approx(overall["pass_at_k"]["1"])
    assert overall["fast_p"]["1.0"] is None and overall["geomean_speedup"] is None  # CPU: speed not measured
    timing = summary["timing_per_sample_s"]
    assert 0 <= timing["harness_overhead_mean"] < timing["evaluation_mean"]
    table = (out / "summary.md").read_text()
    assert "| all problems | 3 | 6 |" in table and "pass@2" in table and "fast_1.5" in table
    assert (out / "summary.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_discover_kernelbench_tree(tmp_path: Path) -> None:
    for level, names in {1: ["10_B.py", "2_A.py", "1_C.py"], 2: ["1_D.py"], 3: ["1_E.py"]}.items():
        (tmp_path / f"level{level}").mkdir()
        for name in names:
            (tmp_path / f"level{level}" / name).write_text("")
    found = discover(tmp_path, levels=[1, 2], limit=2)
    assert [(p.id, p.level) for p in found] == [("level1/1_C", 1), ("level1/2_A", 1), ("level2/1_D", 2)]


@pytest.mark.slow
def test_generate_json(problems: Path) -> None:
    outputs = {}
    for name in ("1_ReLU.py", "3_Matmul.py"):
        run = subprocess.run(
            [
                KERNELZERO,
                "generate",
                str(problems / name),
                "--backend",
                "triton",
                "-n",
                "2",
                "--model-backend",
                "template",
                "--device",
                "cpu",
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert run.returncode == 0, run.stderr[-3000:]
        outputs[name] = json.loads(run.stdout)
    relu, matmul = outputs["1_ReLU.py"], outputs["3_Matmul.py"]
    assert relu["correct"] is True and "@triton.jit" in relu["kernel"] and relu["speedup"] is None and relu["reason"]
    assert relu["verdicts"] and all(v["status"] == "correct" for v in relu["verdicts"])
    assert matmul["correct"] is False and matmul["kernel"] is None
    assert matmul["reason"].startswith("no candidate to score") and all(v["status"] == "declined" for v in matmul["verdicts"])


def test_report_with_measured_speedups(tmp_path: Path) -> None:
    """As on a GPU: two levels, speedups measured; the table and the plot's fast_p curve."""

    def record(problem: str, level: int, sample: int, correct: bool, speedup: float | None) -> dict[str, object]:
        return {
            "problem": problem,
            "level": level,
            "sample": sample,
            "status": "correct" if correct else "incorrect",
            "correct": correct,
            "speedup": speedup,
            "generation_s": 0.5,
            "evaluation_s": 2.0,
            "overhead_s": 0.01,
        }

    records = [
        record("level1/1_A", 1, 0, True, 2.0),
        record("level1/1_A", 1, 1, False, None),
        record("level1/2_B", 1, 0, True, 0.5),
        record("level1/2_B", 1, 1, True, 1.6),
        record("level2/1_C", 2, 0, False, None),
        record("level2/1_C", 2, 1, False, None),
    ]
    summary = write_report(records, 2, {"model": "m", "backend": "triton", "problems_dir": "kb"}, tmp_path)
    level1 = summary["levels"]["level 1"]
    assert level1["pass_at_k"]["1"] == pytest.approx(0.75) and level1["pass_at_k"]["2"] == 1.0
    assert level1["fast_p"]["1.0"] == pytest.approx((0.5 + 0.5) / 2) and level1["fast_p"]["2.0"] == 0.0
    assert level1["geomean_speedup"] == pytest.approx((2.0 * 0.5 * 1.6) ** (1 / 3))
    assert summary["overall"]["pass_at_k"]["2"] == pytest.approx(2 / 3)
    table = (tmp_path / "summary.md").read_text()
    assert "| level 1 | 2 | 4 | 75.0% | 100.0% | 75.0% | 50.0% | 50.0% | 0.0% | 1.17 |" in table
    assert "| overall | 3 | 6 |" in table
    assert (tmp_path / "summary.png").stat().st_size > 10_000


def test_errors_are_recorded_then_retried(
    evaluator: Evaluator, kz_env: Callable[..., Settings], free_port: Callable[[], int], problems: Path, tmp_path: Path
) -> None:
    """An endpoint that does not answer gives error records (the run goes on); the next run redoes
    them, and keeps verdicts unless their status is one it was asked to redo."""
    settings = kz_env(coder_openai_base_url=f"http://127.0.0.1:{free_port()}/v1", coder_model="nobody", coder_max_retries=0)
    relu = [p for p in discover(problems) if p.id == "1_ReLU"]
    out = tmp_path / "eval"

    def run(kind: str, redo: frozenset[str] = frozenset()) -> list[dict[str, object]]:
        harness = Harness(
            build_generator(kind, settings),
            LocalScorer(evaluator),
            "triton",
            1,
            ScoreOptions(device="cpu"),  # type: ignore[arg-type]
            Sampling(n=1),
            out,
            redo=redo,
        )
        return harness.run(relu)

    [failed] = run("openai")
    assert failed["status"] == "error" and failed["correct"] is False and "ModelBackendError" in str(failed["reason"])
    [retried] = run("template")
    assert retried["status"] == "correct" and retried["sample"] == 0
    assert len((out / "samples.jsonl").read_text().splitlines()) == 2  # both kept in the file; the latest counts
    assert run("template") == [retried] and len((out / "samples.jsonl").read_text().splitlines()) == 2  # a verdict is kept...
    [redone] = run("template", redo=frozenset({"correct"}))  # ...unless its status is to be redone (after a scorer fix)
    assert redone["status"] == "correct" and redone != retried and len((out / "samples.jsonl").read_text().splitlines()) == 3


@pytest.mark.slow
def test_concurrent_eval_scores_every_problem_once(evaluator: Evaluator, problems: Path, tmp_path: Path) -> None:
    """Problems scored in threads on one evaluator: one whole JSON line per sample, verdicts as alone."""
    out = tmp_path / "eval"
    harness = Harness(
        build_generator("template", evaluator.settings),
        LocalScorer(evaluator),
        "triton",
        2,
        ScoreOptions(device="cpu"),
        Sampling(n=2),
        out,
        concurrency=3,
    )
    records = harness.run(discover(problems))
    lines = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert sorted((r["problem"], r["sample"]) for r in lines) == [
        (p, s) for p in ("1_ReLU", "2_Softmax", "3_Matmul") for s in (0, 1)
    ]
    status = {r["problem"]: r["status"] for r in records}
    assert status == {"1_ReLU": "correct", "2_Softmax": "correct", "3_Matmul": "declined"}
