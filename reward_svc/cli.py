"""``kernelzero score``: one verdict for a candidate file against a reference file, in this process or
(``--service``) on the running reward service, whose sandboxed children are already warm."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import typer
from rich.console import Console
from rich.markup import escape

from services.config import get_settings
from services.schemas.jobs import FINISHED
from services.schemas.reward import GroupScoreRequest, ScoredVerdict, ScoreOptions

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
    via_service: bool = typer.Option(
        False,
        "--service",
        help="Score on the running reward service (`kernelzero up`'s, at KZ_HOST:KZ_REWARD_PORT, with its key), whose "
        "sandboxes are warm, instead of starting them in this process. The same evaluation; the verdict is its job's.",
    ),
) -> None:
    """Score a kernel. Exit code 0 whenever a verdict was produced, whatever it is."""
    options = ScoreOptions(
        backend=backend,
        device=device,
        timeout_s=timeout,
        trials=trials,
    )
    sources = reference.read_text(), candidate.read_text()
    verdict = _on_the_service(*sources, options) if via_service else _in_this_process(*sources, options)
    if as_json:
        print(json.dumps(verdict.to_json()))
        return
    color = "green" if verdict.correct else "red"
    console.print(f"[bold {color}]{verdict.status}[/]: {verdict.reason}")
    console.print(
        f"reward {verdict.reward:.3f}  speedup {_fmt(verdict.speedup)}  runtime {_fmt(verdict.runtime_ms)} ms  "
        f"reference {_fmt(verdict.ref_runtime_ms)} ms  max abs error {_fmt(verdict.max_abs_error)}"
    )


def _in_this_process(reference: str, candidate: str, options: ScoreOptions) -> ScoredVerdict:
    from reward_svc.evaluate import Evaluator  # torch and the sandbox: only where they run here
    from reward_svc.service import score_group

    request = GroupScoreRequest(reference=reference, candidates=[candidate], options=options)
    settings = get_settings()
    if settings.reward_warm_children is None:  # one reference, one candidate: more children warming would slow these two
        settings = settings.model_copy(update={"reward_warm_children": 2})
    evaluator = Evaluator(settings)
    try:
        with console.status("scoring in the sandbox…"):
            return score_group(request, evaluator).verdicts[0]
    finally:
        evaluator.close()


def _on_the_service(reference: str, candidate: str, options: ScoreOptions) -> ScoredVerdict:
    """The reward service's job for this pair: its worker's children are warm, so a single score costs
    the evaluation, not their start. No verdict (unreachable, refused, the job failed) exits 1 with why."""
    from services.clients import RewardClient, ServiceError, ServiceUnreachable

    wait_s = 2 * options.timeout_s + 60  # a reference and a candidate child, each within the timeout, and the queue
    with RewardClient() as client:
        try:
            with console.status(f"scoring on the reward service at {client.base_url}…"):
                answer = client.score(reference, candidate, options, wait_s=wait_s)
        except (ServiceError, ServiceUnreachable) as exc:
            console.print(f"[red]--service: no verdict from the reward service at {client.base_url}:[/] {escape(str(exc))}")
            if isinstance(exc, ServiceUnreachable):
                console.print("start the platform with `kernelzero up`, or score in this process without --service")
            raise typer.Exit(1) from None
    if answer.verdict is None:
        if answer.job_status in FINISHED:
            console.print(
                f"[red]--service: no verdict: job {answer.job_id} ended {answer.job_status}:[/] {escape(str(answer.error))}"
            )
        else:
            console.print(f"[red]--service: no verdict: job {answer.job_id} is still {answer.job_status} after {wait_s:.0f} s[/]")
        raise typer.Exit(1)
    console.print(f"job {answer.job_id} on {client.base_url}", style="dim")
    return answer.verdict


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"


def install_cli(app: typer.Typer) -> None:
    """The reward service's commands on the platform's ``kernelzero`` command."""
    app.command("score")(score)
