"""The Coder's commands: ``kernelzero generate``, ``kernelzero eval`` and ``kernelzero coder ...``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, get_args

import typer
from rich.console import Console

from services.config import get_settings

coder_app = typer.Typer(help="Coder: model serving helpers.", no_args_is_help=True)
console = Console(stderr=True)
KernelBackendOption = Literal["triton", "cuda"]
DeviceOption = Literal["auto", "cpu", "cuda"]
ModelBackendOption = Literal["template", "openai", "hf"]


def _statuses(values: list[str]) -> frozenset[str]:
    from services.schemas.reward import VerdictStatus

    wanted = frozenset(part.strip() for value in values for part in value.split(",") if part.strip())
    known = (*get_args(VerdictStatus), "declined")
    unknown = sorted(wanted - set(known))
    if unknown:
        raise typer.BadParameter(f"{', '.join(unknown)}: not a status ({', '.join(known)})", param_hint="--redo")
    return wanted


def _generator(model_backend: ModelBackendOption | None) -> Any:
    from coder_svc.generators import build_generator  # model libraries load only when a command needs them

    return build_generator(model_backend, get_settings())


def _sampling(n: int, seed: int | None) -> Any:
    from coder_svc.service import sampling_for
    from services.llm.chat import Sampling

    return sampling_for(n, Sampling(seed=seed), get_settings())


def generate(
    module: Path = typer.Argument(
        ..., exists=True, dir_okay=False, help="KernelBench module (Model, get_inputs, get_init_inputs)."
    ),
    backend: KernelBackendOption = typer.Option("triton", "--backend", help="The kernel language."),
    n: int = typer.Option(4, "-n", "--samples", min=1, max=64, help="Candidates to generate; the best verified one wins."),
    model_backend: ModelBackendOption | None = typer.Option(
        None, "--model-backend", help="Who writes the kernels (default: KZ_CODER_MODEL_BACKEND)."
    ),
    device: DeviceOption = typer.Option("auto", "--device", help="Where the kernels run."),
    timeout: float = typer.Option(180.0, "--timeout", help="Wall-clock limit of each sandboxed child, seconds."),
    seed: int | None = typer.Option(None, "--seed", help="Sampling seed, where the backend honours one."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
) -> None:
    """Generate n kernels for a module and score them in the local sandbox; print the best verified one."""
    from coder_svc.best_of_n import LocalScorer, best_of_n
    from reward_svc import Evaluator
    from services.schemas.reward import ScoreOptions

    options = ScoreOptions(backend=backend, device=device, timeout_s=timeout)
    generator = _generator(model_backend)
    evaluator = Evaluator()
    try:
        with console.status(f"generating {n} candidate(s) with {generator.name} and scoring them in the sandbox…"):
            result = best_of_n(generator, module.read_text(), backend, _sampling(n, seed), LocalScorer(evaluator), options)
    finally:
        evaluator.close()
    if as_json:
        verdicts = [
            {
                "index": c.index,
                "model": c.model,
                **(
                    c.verdict.to_json()
                    if c.verdict
                    else {"status": "declined", "correct": False, "reason": c.declined or "no code in the reply"}
                ),
            }
            for c in result.candidates
        ]
        print(json.dumps({**result.model_dump(exclude={"candidates"}), "verdicts": verdicts}, default=str))
        return
    for c in result.candidates:
        status = c.verdict.status if c.verdict else "declined"
        console.print(
            f"#{c.index} [{'green' if c.verdict and c.verdict.correct else 'red'}]{status}[/]: "
            f"{c.verdict.reason if c.verdict else c.declined}"
        )
    if result.kernel is not None:
        print(result.kernel)
    speed = "not measured" if result.speedup is None else f"{result.speedup:.3g}x"
    console.print(
        f"[bold {'green' if result.correct else 'red'}]{'correct' if result.correct else 'no correct kernel'}[/] "
        f"(speedup {speed}): {result.reason}"
    )


def evaluate(
    problems: Path = typer.Option(
        ..., "--problems", exists=True, file_okay=False, help="KernelBench tree (level1/, ...) or a flat directory."
    ),
    backend: KernelBackendOption = typer.Option("triton", "--backend", help="The kernel language."),
    samples: int = typer.Option(1, "--samples", min=1, max=64, help="Samples per problem (k of pass@k)."),
    levels: list[str] = typer.Option([], "--levels", help="Levels to run: --levels 1,2 or --levels 1 --levels 2 (default: all)."),
    model_backend: ModelBackendOption | None = typer.Option(
        None, "--model-backend", help="Who writes the kernels (default: KZ_CODER_MODEL_BACKEND)."
    ),
    out: Path = typer.Option(
        Path("kernelzero-eval"), "--out", file_okay=False, help="Results; rerun with the same directory to resume."
    ),
    limit: int | None = typer.Option(None, "--limit", min=1, help="First N problems of each level."),
    device: DeviceOption = typer.Option("auto", "--device", help="Where the kernels run."),
    timeout: float = typer.Option(180.0, "--timeout", help="Wall-clock limit of each sandboxed child, seconds."),
    seed: int | None = typer.Option(None, "--seed", help="Sampling seed, where the backend honours one."),
    concurrency: int = typer.Option(
        1, "--concurrency", min=1, max=32, help="Problems scored at once (GPU: 4 overlaps compiles with timing)."
    ),
    redo: list[str] = typer.Option(
        [],
        "--redo",
        help="On resume, evaluate again the samples with these statuses: --redo runtime_error,timeout "
        "(samples whose generator or scorer failed are always redone).",
    ),
    kernelbench_results: bool = typer.Option(
        False,
        "--kernelbench-results",
        help="Also write KernelBench's eval_results.json per level (OUT/kernelbench/level<N>/), as its "
        "scripts/eval_from_generations.py does, for tools that read it.",
    ),
) -> None:
    """pass@k, fast_p and geometric-mean speedup of a model on a problem set: JSON, markdown, plot."""
    from coder_svc.best_of_n import LocalScorer
    from coder_svc.evaluation.harness import ERROR, Harness, discover, load_records
    from coder_svc.evaluation.report import write_report
    from reward_svc import Evaluator
    from services.schemas.reward import ScoreOptions

    try:
        wanted = sorted({int(part) for value in levels for part in value.split(",") if part.strip()})
    except ValueError:
        raise typer.BadParameter(f"levels must be integers, got {levels}") from None
    redo_statuses = _statuses(redo)
    found = discover(problems, wanted or None, limit)
    if not found:
        console.print(f"[red]no problem files under {problems}[/]")
        raise typer.Exit(1)
    options = ScoreOptions(backend=backend, device=device, timeout_s=timeout)
    generator = _generator(model_backend)
    evaluator = Evaluator()
    try:
        harness = Harness(
            generator,
            LocalScorer(evaluator),
            backend,
            samples,
            options,
            _sampling(samples, seed),
            out,
            concurrency,
            redo_statuses,
        )
        records = harness.run(found)
    except KeyboardInterrupt:
        scored = sum(r["status"] != ERROR for r in load_records(out))
        console.print(f"[yellow]interrupted[/]: {scored} scored samples kept in {out}; run the same command to resume")
        raise typer.Exit(130) from None
    finally:
        evaluator.close()
    run = {
        "model": generator.name,
        "backend": backend,
        "problems_dir": str(problems),
        "levels": wanted or "all",
        "device": options.device,
    }
    write_report(records, samples, run, out)
    if kernelbench_results:
        for path in write_kernelbench_results(records, out / "kernelbench"):
            console.print(f"wrote {path} (KernelBench's format)")
    print((out / "summary.md").read_text())
    console.print(
        f"wrote {out / 'summary.json'}, {out / 'summary.md'}, {out / 'summary.png'}; "
        f"per-sample records in {out / 'samples.jsonl'}"
    )


def write_kernelbench_results(records: list[dict[str, Any]], root: Path) -> list[Path]:
    """One ``eval_results.json`` per level (a flat problem directory: one at ``root``)."""
    from services.kernelbench import eval_results

    written = []
    for level in sorted({r["level"] for r in records}, key=lambda n: -1 if n is None else n):
        path = root / (f"level{level}" if level is not None else "") / "eval_results.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(eval_results(r for r in records if r["level"] == level), indent=4))
        written.append(path)
    return written


@coder_app.command("serve")
def serve(
    model: Path = typer.Option(..., "--model", exists=True, file_okay=False, help="Local Hugging Face model directory."),
    lora: Path | None = typer.Option(None, "--lora", exists=True, file_okay=False, help="LoRA adapter (peft) to serve on top."),
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to bind."),
    port: int = typer.Option(8000, "--port", help="Port to listen on."),
    name: str | None = typer.Option(None, "--name", help="Served model name (default: the directory's name)."),
) -> None:
    """Serve a local model over the OpenAI chat-completions protocol (for the openai backend without vLLM)."""
    import uvicorn

    from services.llm.hf_local import HFChatModel
    from services.llm.openai_server import create_openai_app

    with console.status(f"loading {model}…"):
        chat_model = HFChatModel(model, lora, name=name)
    console.print(f"serving [bold]{chat_model.served_name}[/] ({chat_model.version}) at http://{host}:{port}/v1")
    uvicorn.run(create_openai_app(chat_model), host=host, port=port, log_level="warning")


def install_cli(app: typer.Typer) -> None:
    """The Coder's commands on the platform's ``kernelzero`` command."""
    app.add_typer(coder_app, name="coder")
    app.command("generate")(generate)
    app.command("eval")(evaluate)
