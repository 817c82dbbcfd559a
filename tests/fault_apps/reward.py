"""The reward worker with verdicts read off each candidate's text instead of its sandboxed evaluation,
and its time too: a candidate saying "takes 0.5 s" holds its job that long (a fault must find jobs running)."""

from __future__ import annotations

import re
import time
from typing import Any

from reward_svc.evaluate import Evaluation
from reward_svc.service import run_score_job
from services.queue.names import SCORE_GROUP_TASK
from services.queue.worker import create_worker_app
from services.schemas.reward import ScoreOptions, Verdict

TAKES = re.compile(r"takes ([0-9.]+) s")


class VerdictsBySource:
    """Stands in for ``reward_svc.evaluate.Evaluator``: "correct" in a candidate's text makes it correct."""

    def evaluate_group(self, reference: str, candidates: list[str], options: ScoreOptions) -> Evaluation:
        time.sleep(sum(float(m.group(1)) for c in candidates if (m := TAKES.search(c))))
        verdicts = [Verdict("correct" if "correct" in c else "incorrect", "read off the source (a stand-in)") for c in candidates]
        return Evaluation(verdicts, device="cpu")


def score_group_job(job_id: str, payload: dict[str, Any]) -> dict[str, Any]:
    return run_score_job(VerdictsBySource(), job_id, payload)


app = create_worker_app("reward", {SCORE_GROUP_TASK: score_group_job})
