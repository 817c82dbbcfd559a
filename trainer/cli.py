"""The trainer's commands: ``kernelzero train cold-start`` (traces verified, SFT, optionally served),
``kernelzero train tiny-model`` (a tiny Coder built offline, to try the loop on a CPU) and
``kernelzero train run`` (the alternating loop, here, through the running services)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from services.config import get_settings

train_app = typer.Typer(help="Trainer: cold-start SFT of the Coder, the alternating loop.", no_args_is_help=True)
console = Console(stderr=True, soft_wrap=True)  # a refusal is one line, whatever the terminal's width
DeviceOption = Literal["auto", "cpu", "cuda"]


@train_app.command("cold-start")
def cold_start(
    model_path: Path = typer.Option(..., "--model-path", help="Local Hugging Face model directory of the Coder's base model."),
    out: Path = typer.Option(..., "--out", file_okay=False, help="Run directory: traces.jsonl, and model/ unless published."),
    problems: Path | None = typer.Option(
        None, "--problems", exists=True, file_okay=False, help="KernelBench tree or folder: the template teacher's modules."
    ),
    limit: int | None = typer.Option(None, "--limit", min=1, help="First N problems of each level."),
    traces: Path | None = typer.Option(
        None, "--traces", exists=True, dir_okay=False, help="A JSONL of traces (module, completion[, backend])."
    ),
    config: Path | None = typer.Option(None, "--config", exists=True, dir_okay=False, help="ColdStartConfig as YAML or JSON."),
    max_steps: int | None = typer.Option(None, "--max-steps", help="Stop after this many optimizer steps."),
    device: DeviceOption = typer.Option("auto", "--device", help="Where the traces' kernels are verified."),
    timeout: float = typer.Option(180.0, "--timeout", help="Wall-clock limit of each verification child, seconds."),
    publish: bool = typer.Option(
        False, "--publish", help="Save the result as the next coder-v{N} in the model store and serve it (Coder service)."
    ),
) -> None:
    """Verify traces from the template teacher (--problems) and a JSONL (--traces), keep the correct
    ones once each, and fine-tune the Coder on them (TRL's SFTTrainer, loss on the completion)."""
    from coder_svc import build_generator, discover
    from reward_svc import Evaluator
    from services.schemas.reward import ScoreOptions
    from trainer.config import ColdStartConfig, ConfigError, load_config
    from trainer.sft import gather, train, verifier, write_jsonl

    if problems is None and traces is None:
        raise typer.BadParameter("give --problems, --traces or both: there is nothing to train on", param_hint="--problems")
    try:
        run = load_config(ColdStartConfig, config, {"model_path": model_path, "max_steps": max_steps})
        run.check()
    except ConfigError as exc:
        console.print(f"[red]config refused:[/] {exc}")
        raise typer.Exit(1) from None
    if publish:  # the Coder service is asked now, not after hours of training
        from services.clients import CoderClient, ServiceError, ServiceUnreachable

        try:
            with CoderClient() as client:
                backend = client.serving_model().backend
        except (ServiceError, ServiceUnreachable) as exc:
            console.print(f"[red]--publish needs the Coder service:[/] {exc}")
            raise typer.Exit(1) from None
        if backend == "openai" and run.lora is None:
            console.print("[red]full weights cannot be published to vLLM at runtime: train a LoRA adapter (lora:)[/]")
            raise typer.Exit(1)
    settings = get_settings()
    modules = [p.path.read_text() for p in discover(problems, None, limit)] if problems is not None else []
    evaluator = Evaluator(settings)
    try:
        with Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
        ) as progress:
            gathered = gather(
                modules,
                traces,
                build_generator("template", settings),
                verifier(evaluator),
                ScoreOptions(backend="triton", device=device, timeout_s=timeout),
                progress=progress,
            )
    finally:
        evaluator.close()
    for reason in gathered.refused:
        console.print(f"[yellow]{traces.name if traces else ''}[/] {reason}")
    kept = gathered.traces
    write_jsonl(kept, out / "traces.jsonl")
    console.print(f"{len(kept)} verified traces ({gathered.duplicates} duplicates left out) in {out / 'traces.jsonl'}")
    if not kept:
        console.print("[red]no verified trace to train on[/]")
        raise typer.Exit(1)
    if publish:
        from services.clients import CoderClient
        from trainer.publish import publish_version

        with CoderClient() as client:
            served = publish_version(
                "coder",
                lambda directory: train(kept, run, directory),
                settings.data_dir / "models",
                client.switch_model,
                base_model=run.model_path,
                adapter=run.lora is not None,
            )
        console.print(f"serving {served.name} (version {served.id}) from {served.adapter_path or served.base_model}")
    else:
        console.print(f"trained model in {train(kept, run, out / 'model')}")


class _Bars:
    """The loop's phases as rich bars, one per phase of each round."""

    def __init__(self, progress: Progress, round_index: int) -> None:
        self.progress, self.round_index = progress, round_index
        self.task: Any = None

    def phase(self, name: str, total: int) -> None:
        self.task = self.progress.add_task(f"round {self.round_index + 1}: {name}", total=total)

    def advance(self) -> None:
        self.progress.advance(self.task)


@train_app.command("tiny-model")
def tiny_model(
    out: Path = typer.Argument(..., file_okay=False, help="Directory the model and its tokenizer are written to."),
    module: Path = typer.Option(..., "--module", exists=True, dir_okay=False, help="A KernelBench-format module (the task)."),
    kernel: Path = typer.Option(..., "--kernel", exists=True, dir_okay=False, help="A correct ModelNew for it (the reply)."),
    backend: Literal["triton", "cuda"] = typer.Option("triton", "--backend", help="The kernel's language."),
    chance: float = typer.Option(0.4, "--chance", min=0.05, max=0.95, help="How often the model writes the kernel."),
    device: DeviceOption = typer.Option("auto", "--device", help="Where the kernel is verified."),
) -> None:
    """Build a tiny Coder offline to try the loop on a CPU: a 2-layer Llama with its own tokenizer that
    answers the Coder's prompt for the module with the kernel about --chance of the time (something
    else otherwise), so its groups carry a signal and CA-GRPO can raise its reward. The kernel is
    verified in the sandbox first, and the module joins the task pool (a reference task)."""
    from coder_svc import kernel_messages, system_prompt_for
    from reward_svc import Evaluator
    from services.db import migrate
    from services.db.tasks import ensure_task
    from services.schemas.reward import ScoreOptions
    from trainer.tiny_model import build_replying_lm

    settings = get_settings()
    task, candidate = module.read_text(), kernel.read_text()
    with console.status("verifying the kernel in the sandbox"):
        evaluator = Evaluator(settings)
        try:
            verdict = evaluator.evaluate_group(task, [candidate], ScoreOptions(backend=backend, device=device)).verdicts[0]
        finally:
            evaluator.close()
    if not verdict.correct:
        console.print(f"[red]the kernel is not correct ({verdict.status}):[/] {verdict.reason}")
        raise typer.Exit(1)
    with console.status("fitting the tiny model to the kernel"):
        messages = kernel_messages(task, backend, system_prompt_for(backend, settings))
        build_replying_lm(out, messages, f"```python\n{candidate.strip()}\n```", chance=chance)
    migrate.upgrade()  # the pool's database, where no `kernelzero up` made it yet
    task_id = ensure_task(task, "reference")
    console.print(f"built {out}; {module.name} is task {task_id} in the pool. Serve it with")
    console.print(f"  KZ_CODER_MODEL_BACKEND=hf KZ_CODER_HF_MODEL_PATH={out.resolve()} kernelzero up")


@train_app.command("run")
def run(
    config: Path = typer.Option(..., "--config", exists=True, dir_okay=False, help="LoopConfig as YAML or JSON (coder: ...)."),
    rounds: int | None = typer.Option(None, "--rounds", help="Rounds of the loop (overrides the file)."),
    coder_steps: int | None = typer.Option(None, "--coder-steps", help="N: the Coder's optimizer steps per round."),
    proposer_steps: int | None = typer.Option(
        None, "--proposer-steps", help="M: the Proposer's optimizer steps per round (needs proposer: in the file)."
    ),
    model_path: Path | None = typer.Option(None, "--model-path", help="The Coder's base model (overrides coder.model_path)."),
    out: Path | None = typer.Option(None, "--out", file_okay=False, help="Run directory; default: the data dir's runs/<id>."),
) -> None:
    """Run the alternating loop here, round by round, through the running services (kernelzero up):
    the frontier's tasks, G candidates each from the Coder's queue, scored by the reward service,
    CA-GRPO steps, the new version published and served; then, with --proposer-steps, G modules per
    API set from the Proposer, rewarded at the Coder's frontier, GRPO steps, the Proposer's new version
    published and served. Figures go to the database and the run directory (records.jsonl, curves.png)."""
    from services.clients import CoderClient, ServiceError, ServiceUnreachable
    from trainer.config import ConfigError, LoopConfig, load_config
    from trainer.runs import create_run, get_run, play_round

    try:
        loop = load_config(LoopConfig, config, {"rounds": rounds, "coder_steps": coder_steps, "proposer_steps": proposer_steps})
        if model_path is not None:
            loop = loop.model_copy(update={"coder": loop.coder.model_copy(update={"model_path": model_path})})
        run_id = create_run(loop, out)
    except ConfigError as exc:
        console.print(f"[red]config refused:[/] {exc}")
        raise typer.Exit(1) from None
    try:
        with CoderClient() as client:
            client.serving_model()
    except (ServiceError, ServiceUnreachable) as exc:
        console.print(f"[red]the loop needs the running services (kernelzero up):[/] {exc}")
        raise typer.Exit(1) from None
    console.print(f"run {run_id}")
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as bars:
        round_index = 0
        while play_round(run_id, round_index, _Bars(bars, round_index)):
            round_index += 1
    result = get_run(run_id)
    table = Table("round", "half", "pass rate / valid", "reward mean", "steps", "loss", "published", "seconds")
    for record in (r for r in result.records if r.kind == "round"):
        m = record.metrics
        table.add_row(
            str(record.round + 1),
            record.role,
            _figure(m.get("pass_rate") if record.role == "coder" else m.get("valid_fraction")),
            _figure(m.get("reward_mean")),
            str(m.get("steps")),
            _figure(m.get("loss_mean")),
            m.get("published") or "-",
            f"{sum((m.get('seconds') or {}).values()):.0f}",
        )
    console.print(table)
    console.print(f"run {run_id} {result.status}; curves in {Path(result.run_dir) / 'curves.png'}")
    if result.status != "succeeded":
        console.print(f"[red]{result.error or result.status}[/]")
        raise typer.Exit(1)


def _figure(value: Any) -> str:
    return "-" if value is None else f"{value:.3f}"


def install_cli(app: typer.Typer) -> None:
    """The trainer's commands on the platform's ``kernelzero`` command."""
    app.add_typer(train_app, name="train")
