"""``kernelzero score``: one verdict for a candidate file against a reference file, locally."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import typer
from rich.console import Console

from reward_svc.evaluate import Evaluator
from reward_svc.service import score_group
from services.config import get_settings
from services.schemas.reward import GroupScoreRequest, ScoreOptions

console = Console(stderr=True)


def score(
    reference: Path = typer.Option(
        ..., "--reference", exists=True, dir_okay=False, help="KernelBench reference (Model, get_inputs)."
    ),
    candidate: Path = typer.Option(..., "--candidate", exists=True, dir_okay=False, help="KernelBench candidate (ModelNew)."),
    backend: Literal["triton", "cuda"] = typer.Option("triton", "--backend", help="The kernel language."),
    device: Literal["auto", "cpu", "cuda"] = typer.Option("auto", "--device", help="Where it runs."),
    timeout: float = typer.Option(180.0, "--timeout", help="Wall-clock limit of each sandboxed child, seconds."),
    trials: int = typer.Option(3, "--trials", help="Correctness trials with fresh secret inputs."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
) -> None:
    """Score a kernel. Exit code 0 whenever a verdict was produced, whatever it is."""
    options = ScoreOptions(
        backend=backend,
        device=device,
        timeout_s=timeout,
        trials=trials,
    )
    request = GroupScoreRequest(reference=reference.read_text(), candidates=[candidate.read_text()], options=options)
    settings = get_settings()
    if settings.reward_warm_children is None:  # one reference, one candidate: more children warming would slow these two
        settings = settings.model_copy(update={"reward_warm_children": 2})
    evaluator = Evaluator(settings)
    try:
        with console.status("scoring in the sandbox…"):
            verdict = score_group(request, evaluator).verdicts[0]
    finally:
        evaluator.close()
    if as_json:
        print(json.dumps(verdict.to_json()))
        return
    color = "green" if verdict.correct else "red"
    console.print(f"[bold {color}]{verdict.status}[/]: {verdict.reason}")
    console.print(
        f"reward {verdict.reward:.3f}  speedup {_fmt(verdict.speedup)}  runtime {_fmt(verdict.runtime_ms)} ms  "
        f"reference {_fmt(verdict.ref_runtime_ms)} ms  max abs error {_fmt(verdict.max_abs_error)}"
    )


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"


def install_cli(app: typer.Typer) -> None:
    """The reward service's commands on the platform's ``kernelzero`` command."""
    app.command("score")(score)
