"""``kernelzero proposer ...``: mine API statistics, propose and validate modules."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

proposer_app = typer.Typer(help="Proposer: API statistics, module proposals, validation.", no_args_is_help=True)


@proposer_app.command("validate")
def validate(
    files: list[Path] = typer.Argument(..., exists=True, dir_okay=False, help="KernelBench-format module files."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per file on stdout."),
    device: str = typer.Option("auto", "--device", help="auto | cpu | cuda"),
    timeout: float | None = typer.Option(None, "--timeout", help="Seconds per module (default: KZ_PROPOSER_VALIDATION_TIMEOUT_S)."),
    min_ms: float | None = typer.Option(None, "--min-ms", help="Runtime lower bound (default: the device's setting; 0: none)."),
    max_ms: float | None = typer.Option(None, "--max-ms", help="Runtime upper bound (default: the device's setting; 0: none)."),
    parallel: int = typer.Option(1, "--parallel", min=1, help="Sandboxed children at once."),
) -> None:
    """Validate module files in the sandbox: a verdict and its reason per file, duplicates among them
    included. Exit code 0 whenever verdicts were produced, whatever they are."""
    from proposer_svc.validate import ValidationOptions, ValidationResult, Validator

    if device not in ("auto", "cpu", "cuda"):
        raise typer.BadParameter(f"{device!r} is not one of auto, cpu, cuda", param_hint="--device")
    options = ValidationOptions(device=device, timeout_s=timeout, min_ms=min_ms, max_ms=max_ms)  # type: ignore[arg-type]
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
        table.add_row(str(path), "[green]valid[/]" if result.valid else "[red]invalid[/]", result.rule or "",
                      result.reason, "" if runtime is None else f"{runtime:.3g}")
    Console().print(table)
    valid = sum(r.valid for r in results)
    Console().print(f"{valid} of {len(results)} valid on {validator.device}")
