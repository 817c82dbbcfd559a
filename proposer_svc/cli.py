"""``kernelzero proposer ...``: mine API statistics, propose and validate modules."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import typer
from rich.console import Console
from rich.progress import Progress, TaskID
from rich.table import Table

proposer_app = typer.Typer(help="Proposer: API statistics, module proposals, validation.", no_args_is_help=True)


@proposer_app.command("validate")
def validate(
    files: list[Path] = typer.Argument(..., exists=True, dir_okay=False, help="KernelBench-format module files."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per file on stdout."),
    device: Literal["auto", "cpu", "cuda"] = typer.Option("auto", "--device", help="Where the modules run."),
    timeout: float | None = typer.Option(
        None, "--timeout", help="Seconds per module (default: KZ_PROPOSER_VALIDATION_TIMEOUT_S)."
    ),
    min_ms: float | None = typer.Option(None, "--min-ms", help="Runtime lower bound (default: the device's setting; 0: none)."),
    max_ms: float | None = typer.Option(None, "--max-ms", help="Runtime upper bound (default: the device's setting; 0: none)."),
    parallel: int = typer.Option(1, "--parallel", min=1, help="Sandboxed children at once."),
) -> None:
    """Validate module files in the sandbox: a verdict and its reason per file, duplicates among them
    included. Exit code 0 whenever verdicts were produced, whatever they are."""
    from proposer_svc.validate import ValidationOptions, ValidationResult, Validator

    options = ValidationOptions(device=device, timeout_s=timeout, min_ms=min_ms, max_ms=max_ms)
    stderr = Console(stderr=True)
    with Validator(options) as validator, Progress(console=stderr, transient=True, disable=len(files) < 2) as progress:
        task = progress.add_task("validating", total=len(files))

        def on_result(i: int, result: ValidationResult) -> None:
            progress.advance(task)
            if as_json:  # as each verdict arrives: a long batch shows its results early
                print(json.dumps({"path": str(files[i]), **result.model_dump(mode="json")}), flush=True)

        results = validator.validate_many([f.read_text() for f in files], parallel=parallel, on_result=on_result)
    if as_json:
        return
    table = Table("file", "verdict", "rule", "reason", "runtime ms")
    for path, result in zip(files, results):
        runtime = result.details.get("runtime_ms")
        table.add_row(
            str(path),
            "[green]valid[/]" if result.valid else "[red]invalid[/]",
            result.rule or "",
            result.reason,
            "" if runtime is None else f"{runtime:.3g}",
        )
    Console().print(table)
    valid = sum(r.valid for r in results)
    Console().print(f"{valid} of {len(results)} valid on {validator.device}")


@proposer_app.command("mine")
def mine(
    corpus: list[Path] = typer.Option(
        [],
        "--corpus",
        exists=True,
        file_okay=False,
        help="Directory of PyTorch code (repeatable); default: installed transformers modeling files and torch.nn's modules.",
    ),
    name: str = typer.Option(
        "default", "--name", help="Name the statistics are stored under (replaces an earlier mining of that name)."
    ),
) -> None:
    """Mine API usage and co-occurrence from the forward bodies of real modules (parsed, never run)."""
    from proposer_svc.service import mine_corpus

    result = mine_corpus(name, corpus, show_progress=True)
    stats = result.stats
    console = Console()
    console.print(
        f"[bold]{name}[/]: {result.files} files, {stats.modules} forward bodies, {len(stats.usage)} APIs, "
        f"{len(stats.pairs)} pairs; {len(result.skipped)} files skipped (unparseable)"
    )
    for line in result.skipped[:5]:
        console.print(f"  skipped {line}")


@proposer_app.command("stats")
def stats(
    top: int = typer.Option(20, "--top", min=1, help="Rows per table."),
    name: str | None = typer.Option(None, "--name", help="Corpus name (default: KZ_PROPOSER_CORPUS)."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object on stdout: the corpus, its counts, the top rows."),
) -> None:
    """The most frequent APIs and API pairs of the mined statistics."""
    from proposer_svc.mining import load_stats
    from services.config import get_settings

    corpus = name or get_settings().proposer_corpus
    mined = load_stats(corpus)
    if mined is None:
        Console(stderr=True).print(f"[red]no statistics named {corpus!r}[/]: run 'kernelzero proposer mine' first")
        raise typer.Exit(1)
    top_apis = sorted(mined.usage.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    top_pairs = sorted(mined.pairs.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    if as_json:
        print(
            json.dumps(
                {
                    "corpus": corpus,
                    "modules": mined.modules,
                    "apis": len(mined.usage),
                    "pairs": len(mined.pairs),
                    "top_apis": [{"api": api, "modules": count} for api, count in top_apis],
                    "top_pairs": [{"apis": [a, b], "modules": count} for (a, b), count in top_pairs],
                }
            )
        )
        return
    console = Console()
    console.print(f"[bold]{corpus}[/]: {mined.modules} forward bodies, {len(mined.usage)} APIs, {len(mined.pairs)} pairs")
    apis = Table("api", "modules", "share", title=f"top {top} APIs")
    for api, count in top_apis:
        apis.add_row(api, str(count), f"{count / max(mined.modules, 1):.1%}")
    pairs = Table("api", "api", "modules", title=f"top {top} pairs")
    for (a, b), count in top_pairs:
        pairs.add_row(a, b, str(count))
    console.print(apis)
    console.print(pairs)


@proposer_app.command("propose")
def propose(
    count: int = typer.Option(..., "--count", min=1, max=500, help="Modules to propose."),
    backend: Literal["composer", "llm"] | None = typer.Option(
        None, "--backend", help="Who writes the modules (default: KZ_PROPOSER_COMPOSER)."
    ),
    difficulty: float = typer.Option(0.5, "--difficulty", min=0, max=1),
    device: Literal["auto", "cpu", "cuda"] = typer.Option("auto", "--device", help="Where validation runs."),
    seed: int | None = typer.Option(None, "--seed", min=0),
    parallel: int = typer.Option(1, "--parallel", min=1, help="Sandboxed validation children at once."),
    as_json: bool = typer.Option(False, "--json", help="The round's summary as one JSON object on stdout."),
) -> None:
    """Propose modules locally: sample API sets, compose, validate in the sandbox, store as tasks."""
    from pydantic import ValidationError

    from proposer_svc.service import propose as propose_round
    from services.schemas.proposer import ProposeRequest

    try:
        request = ProposeRequest(count=count, backend=backend, difficulty=difficulty, device=device, seed=seed)
    except ValidationError as exc:
        raise typer.BadParameter(str(exc)) from None
    stderr = Console(stderr=True)
    with Progress(console=stderr, transient=as_json) as progress:
        bars: dict[str, TaskID] = {}

        def on_progress(phase: str, done: int, total: int) -> None:
            if phase not in bars:
                bars[phase] = progress.add_task({"compose": "composing", "validate": "validating"}.get(phase, phase), total=total)
            progress.update(bars[phase], completed=done, total=total)

        summary = propose_round(request, parallel=parallel, on_progress=on_progress)
    if as_json:
        print(json.dumps(summary.model_dump(mode="json")))
        return
    console = Console()
    console.print(
        f"{summary.valid} valid, {summary.rejected} rejected, {summary.declined} declined, {summary.exists} already known "
        f"of {summary.requested} in {summary.seconds:.1f} s; {summary.apis_covered} APIs and {summary.pairs_covered} pairs "
        f"covered; sampled from {summary.corpus or 'uniform (no mined statistics)'}"
    )
    if summary.reasons:
        table = Table("rule", "rejected")
        for rule, n in sorted(summary.reasons.items(), key=lambda kv: -kv[1]):
            table.add_row(rule, str(n))
        console.print(table)


def install_cli(app: typer.Typer) -> None:
    """The Proposer's commands on the platform's ``kernelzero`` command."""
    app.add_typer(proposer_app, name="proposer")
