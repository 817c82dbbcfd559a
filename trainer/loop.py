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
after publishing, the round finds the version it published (``publish.published_by``) and stands.
With ``proposer_steps`` the Proposer's half follows (``proposer_half``), checkpointed the same way.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from services.llm.chat import Message, Sampling
from services.schemas.coder import KernelRequest, ScoringIn
from services.schemas.proposer import FrontierOut, ProposeRequest
from services.schemas.serving import ServingModel
from trainer.config import LoopConfig
from trainer.intake import coder_samples
from trainer.policy import PolicyTrainer, StepReport
from trainer.proposer_half import ProposerOutcome, proposer_half
from trainer.publish import publish_version, published_by, serve_version, served_weights, version_path
from trainer.records import RunRecorder
from trainer.rollouts import UNSCORED, Sample, claim_groups, record_group
from trainer.round_context import Cancelled, LoopError, Progress, Quiet, Services, await_kernel, claim_key, release_claims


@dataclass
class Checkpoint:
    """Where a run stands: rounds trained and published, and the version the last one published."""

    rounds_done: int = 0
    adapter_path: Path | None = None  # the Coder's last published version's directory (adapter or whole model)
    proposer_path: Path | None = None  # the Proposer's


@dataclass
class Generated:
    """What one round's generation produced, for the round's figures."""

    groups: int = 0
    candidates: int = 0
    scored: int = 0
    correct: int = 0
    rewards: list[float] = field(default_factory=list)
    speed_paid_groups: int = 0  # groups where some reward went past 1: the CA-GRPO speed term paid
    # Summed over the generation jobs, which run side by side: where the "generate" wall time went.
    job_seconds: dict[str, float] = field(default_factory=lambda: {"sample": 0.0, "score": 0.0})


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
        result = await_kernel(services.coder, job_id, config.generation_timeout_s)
        samples = coder_samples(result, render, config.coder.reward)
        record_group("coder", samples, group_id=job_id, task_id=task_id, job_id=job_id, model_version_id=result.model_version_id)
        _count(generated, samples)
        if result.seconds is not None:
            generated.job_seconds["sample"] += result.seconds.sample
            generated.job_seconds["score"] += result.seconds.score
        progress.advance()
    return generated


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
    trainer: PolicyTrainer,
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


@dataclass(frozen=True)
class Published:
    """The versions a round published (None: that half had no group with a signal, or did not run)."""

    coder: ServingModel | None = None
    proposer: ServingModel | None = None


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
) -> tuple[Checkpoint, Published]:
    """One round from ``checkpoint``: the Coder's half, then (with ``proposer_steps``) the Proposer's;
    the new checkpoint and the versions the round published."""
    progress = progress or Quiet()
    key = claim_key(run_id, round_index)
    coder_path, coder = coder_half(
        config, key, round_index, checkpoint.adapter_path, services, store, recorder, progress, cancelled
    )
    proposer = ProposerOutcome(checkpoint.proposer_path, None)
    if config.proposer_steps:
        proposer = proposer_half(
            config, key, round_index, checkpoint.proposer_path, services, store, recorder, progress, cancelled
        )
    return Checkpoint(checkpoint.rounds_done + 1, coder_path, proposer.path), Published(coder, proposer.published)


def coder_half(
    config: LoopConfig,
    key: str,
    round_index: int,
    checkpoint: Path | None,
    services: Services,
    store: Path,
    recorder: RunRecorder,
    progress: Progress,
    cancelled: Callable[[], bool],
) -> tuple[Path | None, ServingModel | None]:
    """The Coder's half from the version it last published (``checkpoint``): that version's directory
    after the half, and the version it published (None where no group carried a signal: nothing was
    trained, the served version stays)."""
    from services.llm.hf_local import render_prompt

    adapter = config.coder.lora is not None
    done = published_by(store, "coder", key)
    if done is not None:  # its worker died after publishing, before the run recorded it: the half stands
        recovered = serve_version(done, services.coder.switch_model, base_model=config.coder.model_path, adapter=adapter)
        if not recorder.has_round(round_index):
            recorder.round(round_index, {"published": recovered.name, "published_id": recovered.id, "recovered": True})
        return done, recovered
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
    trainer = PolicyTrainer(
        config.coder,
        total_steps=config.rounds * config.coder_steps,
        resume_from=checkpoint or served_weights(serving, adapter=adapter),
        steps_done=round_index * config.coder_steps,
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
        published = publish_version(
            "coder",
            trainer.save,
            store,
            services.coder.switch_model,
            base_model=config.coder.model_path,
            adapter=adapter,
            origin=key,
        )
        checkpoint = version_path(published) or checkpoint
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
        "generation_job_seconds": generated.job_seconds,
        "finished_at": datetime.now(UTC).isoformat(),
    }
