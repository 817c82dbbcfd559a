"""A run's figures, where people look for them: a row per optimizer step and per finished round in the
database (``GET /v1/runs/{id}``), the same rows as JSON lines in the run directory (``records.jsonl``),
and their curves as a PNG there (``curves.png``, redrawn after every round)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from sqlalchemy import select

from services.db.models import TrainingRecord
from services.db.session import session_scope
from services.metrics import record_trainer_step

RECORDS_FILE = "records.jsonl"
CURVES_FILE = "curves.png"
Role = Literal["coder", "proposer"]


class RunRecorder:
    """Writes one run's records; ``plot`` draws what the database holds for it."""

    def __init__(self, run_id: str, run_dir: Path) -> None:
        self.run_id, self.run_dir = run_id, run_dir
        run_dir.mkdir(parents=True, exist_ok=True)

    def step(self, round_index: int, step: int, metrics: dict[str, Any], role: Role = "coder") -> None:
        self._write("step", round_index, step, metrics, role)
        record_trainer_step(role, metrics)

    def round(self, round_index: int, metrics: dict[str, Any], role: Role = "coder") -> None:
        self._write("round", round_index, None, metrics, role)
        self.plot()

    def _write(self, kind: str, round_index: int, step: int | None, metrics: dict[str, Any], role: Role) -> None:
        with session_scope() as session:
            session.add(
                TrainingRecord(run_id=self.run_id, kind=kind, role=role, round=round_index, step=step, metrics=_finite(metrics))
            )
        self._export()

    def has_round(self, round_index: int, role: Role = "coder") -> bool:
        """Whether a half's own row is recorded (its last write before the run counts it done)."""
        return any(r.kind == "round" and r.round == round_index and r.role == role for r in run_records(self.run_id))

    def forget_round(self, round_index: int, role: Role = "coder") -> None:
        """A half of a round started again (its worker died before it published): its rows go."""
        with session_scope() as session:
            for row in session.scalars(
                select(TrainingRecord).where(
                    TrainingRecord.run_id == self.run_id, TrainingRecord.round == round_index, TrainingRecord.role == role
                )
            ):
                session.delete(row)
        self._export()

    def _export(self) -> None:
        """The run directory's copy of the rows, written whole (a round started again leaves no stale line)."""
        lines = [
            json.dumps({"kind": r.kind, "role": r.role, "round": r.round, "step": r.step, **r.metrics})
            for r in run_records(self.run_id)
        ]
        staging = self.run_dir / f".{RECORDS_FILE}.tmp"
        staging.write_text("".join(line + "\n" for line in lines))
        staging.replace(self.run_dir / RECORDS_FILE)

    def plot(self) -> Path:
        return plot_records(run_records(self.run_id), self.run_dir / CURVES_FILE)


def run_records(run_id: str) -> list[TrainingRecord]:
    with session_scope() as session:
        rows = list(
            session.scalars(
                select(TrainingRecord)
                .where(TrainingRecord.run_id == run_id)
                .order_by(
                    TrainingRecord.round,
                    TrainingRecord.role,
                    TrainingRecord.kind.desc(),
                    TrainingRecord.step,
                    TrainingRecord.created_at,
                )
            )
        )
        session.expunge_all()
        return rows


def plot_records(records: Iterable[TrainingRecord], path: Path) -> Path:
    """Each role's reward and loss per optimizer step, the Coder's pass rate and the share of the
    Proposer's modules that were valid per round."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = list(records)
    figure, (reward_axis, loss_axis, round_axis) = plt.subplots(1, 3, figsize=(13, 3.6))
    for role, colour in (("coder", "tab:blue"), ("proposer", "tab:purple")):
        steps = [r for r in records if r.kind == "step" and r.role == role]
        if not steps:
            continue
        x = list(range(1, len(steps) + 1))
        reward_axis.plot(x, [r.metrics.get("reward_mean") for r in steps], marker="o", color=colour, label=f"{role} mean")
        reward_axis.plot(
            x, [r.metrics.get("reward_std") for r in steps], marker=".", linestyle=":", color=colour, label=f"{role} std"
        )
        loss_axis.plot(x, [r.metrics.get("loss") for r in steps], marker="o", color=colour, label=role)
    reward_axis.set(title="Reward per step", xlabel="optimizer step (each role's)")
    loss_axis.set(title="Policy loss", xlabel="optimizer step (each role's)")
    for axis in (reward_axis, loss_axis):
        if axis.lines:
            axis.legend(fontsize="small")
    for role, figure_name, label, colour in (
        ("coder", "pass_rate", "Coder pass rate", "tab:green"),
        ("proposer", "valid_fraction", "Proposer valid share", "tab:purple"),
    ):
        rounds = [r for r in records if r.kind == "round" and r.role == role]
        if rounds:
            round_axis.plot(
                [r.round + 1 for r in rounds], [r.metrics.get(figure_name) for r in rounds], marker="s", color=colour, label=label
            )
    round_axis.set(title="Per round", xlabel="round", ylim=(0, 1))
    if round_axis.lines:
        round_axis.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def _finite(metrics: dict[str, Any]) -> dict[str, Any]:
    """JSON holds no NaN: a figure that is not a number (no gradient this step) is None."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}
