"""``kernelzero ci MODULE.py``: a verified kernel for a module, from a CI job.

Asks a running platform's Coder service for ``n`` candidates (each verified by its reward service),
waits with a progress display, then writes next to the module the best verified kernel
(``<module>_kernelzero.py``) and a markdown summary (``<module>_kernelzero.md``: every candidate's
verdict, speedup, runtime and, for each one turned down, the reason). The exit code is the bar:

- 0: a verified kernel that meets the bar (``--min-speedup``, where given);
- 1: the bar was missed: no candidate verified, a speedup below the bar, or no speedup measured (a
  reward service without a GPU times nothing) while a bar was set;
- 2: no answer: the platform could not be reached, refused the module (the reason is printed), the job
  failed, or it did not finish within ``--timeout``.

An example GitHub Actions workflow is docs/examples/kernelzero-ci.yml.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from services.clients import CoderClient, JobTimeout, ServiceError, ServiceUnreachable
from services.schemas.coder import KernelBackendName, KernelRequest, KernelResult, ScoringIn
from services.schemas.jobs import FINISHED
from services.schemas.reward import ScoreDevice

BAR_MET, BAR_MISSED, NO_ANSWER = 0, 1, 2
console = Console(stderr=True)  # progress and messages; stdout stays free for the paths written


@dataclass(frozen=True)
class Outcome:
    met: bool
    verdict: str  # one line: why the bar was met or missed


def judge(result: KernelResult, min_speedup: float | None) -> Outcome:
    """Whether ``result`` meets the bar, and the one line that says why."""
    if not result.correct:
        return Outcome(False, f"no verified kernel: {result.reason}")
    if min_speedup is None:
        return Outcome(True, "verified kernel" + (f", speedup {result.speedup:.2f}x" if result.speedup else ""))
    if result.speedup is None:
        return Outcome(
            False,
            f"verified kernel, but no speedup measured (a reward service without a GPU): the bar {min_speedup}x is not shown",
        )
    if result.speedup < min_speedup:
        return Outcome(False, f"verified kernel at {result.speedup:.2f}x, below the bar {min_speedup}x")
    return Outcome(True, f"verified kernel at {result.speedup:.2f}x (bar {min_speedup}x)")


def summary_markdown(module: Path, backend: str, result: KernelResult, outcome: Outcome, kernel_path: Path | None) -> str:
    def cell(value: object) -> str:
        return "" if value is None else str(value).replace("|", "\\|").replace("\n", " ")

    lines = [
        f"# KernelZero: `{module.name}` ({backend})",
        "",
        f"**{'Bar met' if outcome.met else 'Bar missed'}**: {cell(outcome.verdict)}.",
        "",
        f"Kernel: `{kernel_path.name}`" if kernel_path else "No kernel written.",
        "",
        "| candidate | verdict | speedup | runtime (ms) | reason |",
        "|---|---|---|---|---|",
    ]
    for report in result.candidates:
        verdict = report.verdict
        status = verdict.status if verdict else "declined"
        speedup = f"{verdict.speedup:.2f}x" if verdict and verdict.speedup else ""
        runtime = f"{verdict.runtime_ms:.4g}" if verdict and verdict.runtime_ms else ""
        reason = verdict.reason if verdict else report.declined
        best = " (best)" if report.index == result.best_index else ""
        lines.append(f"| {report.index}{best} | {status} | {speedup} | {runtime} | {cell(reason)} |")
    return "\n".join(lines) + "\n"


def wait_with_progress(client: CoderClient, job_id: str, timeout_s: float) -> str:
    """Polls the job, showing its state, until it finished; its final status. ``JobTimeout`` past ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task(f"job {job_id}: queued")
        while True:
            job = client.get_job(job_id)
            progress.update(
                task, description=f"job {job_id}: {job.status}" + (f" (attempt {job.attempts})" if job.attempts > 1 else "")
            )
            if job.status in FINISHED:
                return job.status
            if time.monotonic() > deadline:
                raise JobTimeout(job, timeout_s)
            time.sleep(1.0)


def ci(
    module: Path = typer.Argument(
        ..., exists=True, dir_okay=False, help="The KernelBench module: Model, get_inputs, get_init_inputs."
    ),
    backend: KernelBackendName = typer.Option("triton", "--backend", help="The kernel language."),
    min_speedup: float | None = typer.Option(
        None, "--min-speedup", min=0, help="The bar: the kernel must be at least this much faster."
    ),
    url: str | None = typer.Option(
        None, "--url", help="The Coder service (default: KZ_HOST and KZ_CODER_PORT); key from KZ_API_KEY."
    ),
    n: int = typer.Option(4, "-n", "--candidates", min=1, max=64, help="Candidates to generate; the best verified one wins."),
    device: ScoreDevice = typer.Option("auto", "--device", help="Where the reward service runs them."),
    timeout: float = typer.Option(1800.0, "--timeout", min=1, help="Seconds to wait for the verdicts."),
) -> None:
    """A verified kernel for MODULE.py from a running platform: written next to it with a markdown summary;
    exit 0 when it meets the bar, 1 when it misses it, 2 when there is no answer."""
    try:
        request = KernelRequest(module=module.read_text(), backend=backend, n=n, wait_s=0, scoring=ScoringIn(device=device))
    except ValidationError as exc:
        reasons = "; ".join(str(error["msg"]).removeprefix("Value error, ") for error in exc.errors())
        console.print(f"[red]refused[/]: {module}: {escape(reasons)}", soft_wrap=True)
        raise typer.Exit(NO_ANSWER) from None
    try:
        with CoderClient(url) as client:
            job_id = client.generate(request).job_id
            status = wait_with_progress(client, job_id, timeout)
            answer = client.kernel(job_id)
    except ServiceError as exc:
        console.print(f"[red]refused[/] ({exc.status_code}): {escape(exc.detail)}", soft_wrap=True)
        raise typer.Exit(NO_ANSWER) from None
    except (ServiceUnreachable, JobTimeout) as exc:
        console.print(f"[red]no answer[/]: {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(NO_ANSWER) from None
    if answer.result is None:
        console.print(f"[red]job {job_id} {status}[/]: {escape(answer.error or 'no result')}", soft_wrap=True)
        raise typer.Exit(NO_ANSWER)
    result = answer.result
    outcome = judge(result, min_speedup)
    kernel_path = None
    if result.correct and result.kernel:
        kernel_path = module.with_name(f"{module.stem}_kernelzero.py")
        kernel_path.write_text(result.kernel)
        print(kernel_path)
    summary_path = module.with_name(f"{module.stem}_kernelzero.md")
    summary_path.write_text(summary_markdown(module, backend, result, outcome, kernel_path))
    print(summary_path)
    console.print(
        f"[{'green' if outcome.met else 'red'}]{'bar met' if outcome.met else 'bar missed'}[/]: {escape(outcome.verdict)}"
    )
    raise typer.Exit(BAR_MET if outcome.met else BAR_MISSED)


def install_cli(app: typer.Typer) -> None:
    """``kernelzero ci`` on the platform's command."""
    app.command("ci")(ci)
