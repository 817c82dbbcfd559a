"""The alternating loop, one round at a time, through the services' own HTTP APIs and queues.

A round: the Proposer composes and validates new modules (``propose_per_round``); the frontier picks
the round's tasks from the pool (those the Coder solves about half the time, and unmeasured ones);
the Coder's queue samples G candidates per task with the served version and the reward service's
queue scores them; each job's candidates become one rollout group; the trainer claims whole groups
(once, under the round's claim key) and takes ``coder_steps`` CA-GRPO steps; the result is published
as the next ``coder-v{N}`` and served. The Coder's failures reach the next round's API sampling
through the verdicts the reward service stored (the Proposer's failure bias).

A round is the checkpoint: its version is published before the run records it done, and a round
started again after its worker died trains afresh from the last published version, its claims
released first, so no group is trained on by two versions of one lineage; where the worker died
after publishing, the round finds the version it published (``publish.published_by``) and stands. Proposer RL (training the
``llm`` composer on the frontier reward) is not built yet: ``LoopConfig`` refuses ``proposer_steps``.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy import update

from services.clients import CoderClient, ProposerClient
from services.clients.base import JobTimeout
from services.db.models import RolloutGroup
from services.db.session import session_scope
from services.llm.chat import Message, Sampling
from services.schemas.coder import KernelRequest, KernelResult, ScoringIn
from services.schemas.proposer import FrontierOut, ProposeRequest
from services.schemas.serving import ServingModel
from trainer.coder_rl import CoderTrainer, StepReport
from trainer.config import LoopConfig
from trainer.intake import coder_samples
from trainer.publish import publish_coder, published_by, serve_coder
from trainer.records import RunRecorder
from trainer.rollouts import UNSCORED, Sample, claim_groups, record_group


class Cancelled(Exception):
    """The run was asked to stop; the last published round stands."""


class LoopError(RuntimeError):
    """A round cannot go on (a service that does not answer, a generation job that failed); the
    message says which and why; the last published round stands."""


class Progress(Protocol):
    """What the loop reports as it goes (rich's ``Progress`` in the CLI, nothing in a worker)."""

    def phase(self, name: str, total: int) -> None: ...
    def advance(self) -> None: ...


class Quiet:
    def phase(self, name: str, total: int) -> None:
        pass

    def advance(self) -> None:
        pass


@dataclass
class Services:
    """The clients a round drives; the CLI and the trainer's worker open them the same way."""

    proposer: ProposerClient
    coder: CoderClient


@dataclass
class Checkpoint:
    """Where a run stands: rounds trained and published, and the version the last one published."""

    rounds_done: int = 0
    adapter_path: Path | None = None  # the last published version's directory (adapter or whole model)


@dataclass
class Generated:
    """What one round's generation produced, for the round's figures."""

    groups: int = 0
    candidates: int = 0
    scored: int = 0
    correct: int = 0
    rewards: list[float] = field(default_factory=list)
    speed_paid_groups: int = 0  # groups where some reward went past 1: the CA-GRPO speed term paid


def served_weights(serving: ServingModel, config: LoopConfig) -> Path | None:
    """Where a run that has published nothing yet starts: the weights the Coder samples with (a
    cold-start adapter, or a published whole model), so the policy trained is the one sampled."""
    if config.coder.lora is not None:
        return Path(serving.adapter_path) if serving.adapter_path else None
    if serving.id is not None and serving.adapter_path is None and serving.base_model:
        return Path(serving.base_model)
    return None


def claim_key(run_id: str, round_index: int) -> str:
    return f"{run_id}/r{round_index}"


def release_claims(key: str) -> int:
    """Give back what an attempt of a round claimed that died before it published."""
    with session_scope() as session:
        released = session.execute(
            update(RolloutGroup).where(RolloutGroup.claimed_by == key).values(claimed_by=None, claimed_at=None, dropped=None)
        )
        return int(released.rowcount)  # type: ignore[attr-defined]  # an UPDATE's result is a CursorResult


def pick_tasks(config: LoopConfig, services: Services, round_index: int) -> tuple[FrontierOut, list[tuple[str, str]]]:
    """New modules (where asked for), then the frontier's selection as (task id, module source)."""
    if config.propose_per_round:
        proposed = services.proposer.propose(
            ProposeRequest(
                count=config.propose_per_round, backend=config.composer, device=config.device, seed=config.seed + round_index
            ),
            wait_s=config.generation_timeout_s,
        )
        if proposed.job_status != "succeeded":
            raise LoopError(f"the Proposer's round did not finish ({proposed.job_status}): {proposed.error or 'no error given'}")
    frontier = services.proposer.frontier(count=config.tasks)
    if not frontier.tasks:
        raise LoopError("the task pool is empty: propose modules (propose_per_round) or add reference tasks first")
    return frontier, [(t.task_id, services.proposer.task(t.task_id).source) for t in frontier.tasks]


def generate(
    config: LoopConfig,
    services: Services,
    tasks: list[tuple[str, str]],
    round_index: int,
    render: Callable[[list[Message]], str],
    progress: Progress,
    cancelled: Callable[[], bool],
) -> Generated:
    """G candidates per task through the Coder's queue (all submitted first, so its workers and the
    reward service's run them side by side), each finished job stored as one rollout group."""
    sampling = Sampling(
        n=config.coder.group_size,
        temperature=config.coder.temperature,
        top_p=config.top_p,
        max_tokens=config.max_tokens,
        logprobs=True,
    )
    scoring = ScoringIn(device=config.device, timeout_s=config.scoring_timeout_s)
    jobs = []
    for index, (task_id, module) in enumerate(tasks):
        request = KernelRequest(
            module=module,
            backend=config.backend,
            n=config.coder.group_size,
            wait_s=0,
            model_backend=config.model_backend,
            sampling=sampling.model_copy(update={"seed": config.seed + 1_000_003 * round_index + index}),
            scoring=scoring,
        )
        jobs.append((task_id, services.coder.generate(request).job_id))
    progress.phase("generating and scoring", len(jobs))
    generated = Generated()
    for task_id, job_id in jobs:
        if cancelled():
            raise Cancelled
        result = _finished(services.coder, job_id, config.generation_timeout_s)
        samples = coder_samples(result, render, config.coder.reward)
        record_group("coder", samples, group_id=job_id, task_id=task_id, job_id=job_id, model_version_id=result.model_version_id)
        _count(generated, samples)
        progress.advance()
    return generated


def _finished(coder: CoderClient, job_id: str, timeout_s: float) -> KernelResult:
    try:
        job = coder.wait_for_job(job_id, timeout_s=timeout_s, poll_s=1.0)
    except JobTimeout as exc:
        raise LoopError(f"generation job {job_id} did not finish in {timeout_s:.0f} s") from exc
    response = coder.kernel(job.id)
    if response.result is None:
        raise LoopError(f"generation job {job_id} {response.job_status}: {response.error or 'no result'}")
    return response.result


def _count(generated: Generated, samples: list[Sample]) -> None:
    """The round's figures from the group's samples, as the trainer sees them (its rewards, a reply with
    no program a failure); an unscored sample counts for nothing."""
    rewards = [s.reward for s in samples if s.status != UNSCORED and s.reward is not None]
    generated.groups += 1
    generated.candidates += len(samples)
    generated.scored += len(rewards)
    generated.correct += sum(1 for s in samples if s.status == "correct")
    generated.rewards += rewards
    generated.speed_paid_groups += any(r > 1.0 for r in rewards)


def train(
    config: LoopConfig,
    trainer: CoderTrainer,
    key: str,
    current_version: str | None,
    on_step: Callable[[int, StepReport, Counter[str]], None],
    progress: Progress,
    cancelled: Callable[[], bool],
) -> tuple[list[StepReport], Counter[str]]:
    """Up to ``coder_steps`` steps, each on ``groups_per_step`` claimed groups; fewer where the claims
    run out (every group dropped: no signal, stale, unscored)."""
    reports: list[StepReport] = []
    dropped: Counter[str] = Counter()
    progress.phase("training the Coder", config.coder_steps)
    for step in range(config.coder_steps):
        if cancelled():
            raise Cancelled
        claim = claim_groups(
            key,
            "coder",
            max_groups=config.coder.groups_per_step,
            group_size=config.coder.group_size,
            current_version=current_version,
            max_staleness=config.coder.max_staleness,
        )
        dropped.update(claim.dropped)
        if not claim.groups:
            break
        report = trainer.step(claim.groups)
        reports.append(report)
        on_step(step, report, claim.dropped)
        progress.advance()
    return reports, dropped


def run_round(
    config: LoopConfig,
    run_id: str,
    round_index: int,
    checkpoint: Checkpoint,
    services: Services,
    store: Path,
    recorder: RunRecorder,
    *,
    progress: Progress | None = None,
    cancelled: Callable[[], bool] = lambda: False,
) -> tuple[Checkpoint, ServingModel | None]:
    """One round from ``checkpoint``; the new checkpoint and the version it published (None where no
    group carried a signal: nothing was trained, the served version stays)."""
    from services.llm.hf_local import render_prompt

    progress = progress or Quiet()
    key = claim_key(run_id, round_index)
    done = published_by(store, "coder", key)
    if done is not None:  # its worker died after publishing, before the run recorded it: the round stands
        recovered = serve_coder(
            done, services.coder.switch_model, base_model=config.coder.model_path, adapter=config.coder.lora is not None
        )
        if not recorder.has_round(round_index):
            recorder.round(round_index, {"published": recovered.name, "published_id": recovered.id, "recovered": True})
        return Checkpoint(checkpoint.rounds_done + 1, done), recovered
    release_claims(key)
    recorder.forget_round(round_index)
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    serving = services.coder.serving_model()
    if (config.model_backend or serving.backend) == "template":
        raise LoopError(
            "the Coder serves the template teacher, which has no weights to train: "
            "serve a model (KZ_CODER_MODEL_BACKEND=hf or openai) or set model_backend"
        )
    frontier, tasks = pick_tasks(config, services, round_index)
    seconds["propose"] = time.perf_counter() - started
    trainer = CoderTrainer(
        config.coder,
        total_steps=config.rounds * config.coder_steps,
        resume_from=checkpoint.adapter_path or served_weights(serving, config),
        steps_done=checkpoint.rounds_done * config.coder_steps,
    )
    started = time.perf_counter()
    generated = generate(config, services, tasks, round_index, lambda m: render_prompt(trainer.tokenizer, m), progress, cancelled)
    seconds["generate"] = time.perf_counter() - started

    def on_step(step: int, report: StepReport, dropped: Counter[str]) -> None:
        recorder.step(
            round_index, step, {**asdict(report), "tokens_per_second": report.tokens_per_second, "dropped": dict(dropped)}
        )

    started = time.perf_counter()
    reports, dropped = train(config, trainer, key, serving.id, on_step, progress, cancelled)
    seconds["train"] = time.perf_counter() - started
    published = None
    started = time.perf_counter()
    if reports:
        published = publish_coder(
            trainer.save,
            store,
            services.coder.switch_model,
            base_model=config.coder.model_path,
            adapter=config.coder.lora is not None,
            origin=key,
        )
        path = published.adapter_path or published.base_model
        checkpoint = Checkpoint(checkpoint.rounds_done + 1, Path(path) if path else checkpoint.adapter_path)
    else:
        checkpoint = Checkpoint(checkpoint.rounds_done + 1, checkpoint.adapter_path)
    seconds["publish"] = time.perf_counter() - started
    recorder.round(round_index, _round_metrics(generated, frontier, reports, dropped, serving, published, seconds))
    return checkpoint, published


def _round_metrics(
    generated: Generated,
    frontier: FrontierOut,
    reports: list[StepReport],
    dropped: Counter[str],
    served: ServingModel,
    published: ServingModel | None,
    seconds: dict[str, float],
) -> dict[str, Any]:
    rewards = generated.rewards
    losses = [r.loss for r in reports]
    kls = [r.kl for r in reports if r.kl is not None]
    return {
        "tasks": len(frontier.tasks),
        "groups": generated.groups,
        "candidates": generated.candidates,
        "scored": generated.scored,
        "pass_rate": generated.correct / generated.scored if generated.scored else None,
        "reward_mean": statistics.fmean(rewards) if rewards else None,
        "reward_std": statistics.pstdev(rewards) if rewards else None,
        "speed_rewarded_fraction": generated.speed_paid_groups / generated.groups if generated.groups else None,
        "frontier_bin_edges": frontier.bin_edges,
        "frontier_histogram": frontier.histogram,
        "steps": len(reports),
        "loss_mean": statistics.fmean(losses) if losses else None,
        "kl_mean": statistics.fmean(kls) if kls else None,
        "clip_fraction": statistics.fmean([r.clip_fraction for r in reports]) if reports else None,
        "tokens_per_second": statistics.fmean([r.tokens_per_second for r in reports]) if reports else None,
        "step_seconds": statistics.fmean([r.seconds for r in reports]) if reports else None,
        "dropped": dict(dropped),
        "sampled_with": served.name,
        "published": published.name if published else None,
        "published_id": published.id if published else None,
        "seconds": seconds,
        "finished_at": datetime.now(UTC).isoformat(),
    }
