"""The Proposer's half of a round, the Coder frozen: the Proposer's ``llm`` composer samples G modules
per API set (one group each), the Proposer service validates and stores them, the Coder's queue
samples k candidates on each valid new module and the reward service judges them, the Coder's pass
rate p sets each module's frontier reward (``1 - |2p - 1|``: highest where the Coder solves it half
the time; the penalty ρ for a module that is declined, rejected or not new), and the Proposer trains
``proposer_steps`` GRPO steps on the groups and publishes ``proposer-v{N}``, which the Proposer then
serves. The modules it proposed join the task pool the Coder's next half draws from.

Checkpointing is the Coder half's: the half's version is published before the run records it, a half
started again releases what it claimed first, and one whose worker died after publishing finds its
version (``publish.published_by``) and stands.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from proposer_svc import FrontierConfig, frontier_reward
from services.clients import ProposerClient
from services.llm.chat import Sampling
from services.schemas.coder import KernelRequest, ScoringIn
from services.schemas.proposer import ProposeRequest, ProposeSummary
from services.schemas.serving import ModelSwitch, ServingModel
from trainer.config import LoopConfig, ProposerRLConfig
from trainer.intake import pass_rate, proposer_samples
from trainer.policy import PolicyTrainer, StepReport
from trainer.publish import publish_version, published_by, serve_version, served_weights, version_path
from trainer.records import RunRecorder
from trainer.rollouts import UNSCORED, claim_groups, record_group
from trainer.round_context import Cancelled, LoopError, Progress, Services, await_kernel, release_claims

ROLE: Final = "proposer"


@dataclass(frozen=True)
class ProposerOutcome:
    """Where the Proposer's half left the run: its last version's directory, and the version it published."""

    path: Path | None
    published: ServingModel | None


def half_key(claim_key: str) -> str:
    """What the Proposer's half claims and publishes under (the round's key is the Coder half's)."""
    return f"{claim_key}/{ROLE}"


def proposer_half(
    config: LoopConfig,
    key: str,
    round_index: int,
    checkpoint: Path | None,
    services: Services,
    store: Path,
    recorder: RunRecorder,
    progress: Progress,
    cancelled: Callable[[], bool],
) -> ProposerOutcome:
    """The Proposer's half from the version it last published (``checkpoint``)."""
    from services.llm.hf_local import render_prompt

    proposer = config.proposer
    assert proposer is not None, "LoopConfig refuses proposer_steps without the Proposer's settings"
    key = half_key(key)
    adapter = proposer.lora is not None
    done = published_by(store, ROLE, key)
    if done is not None:  # its worker died after publishing, before the run recorded it: the half stands
        recovered = serve_version(done, services.proposer.switch_model, base_model=proposer.model_path, adapter=adapter)
        if not recorder.has_round(round_index, ROLE):
            recorder.round(round_index, {"published": recovered.name, "published_id": recovered.id, "recovered": True}, ROLE)
        return ProposerOutcome(done, recovered)
    release_claims(key)
    recorder.forget_round(round_index, ROLE)
    seconds: dict[str, float] = {}
    serving = serve_policy(proposer, services.proposer)
    trainer = PolicyTrainer(
        proposer,
        total_steps=config.rounds * config.proposer_steps,
        resume_from=checkpoint or served_weights(serving, adapter=adapter),
        steps_done=round_index * config.proposer_steps,
    )

    started = time.perf_counter()
    progress.phase("the Proposer sampling", 1)
    proposed = services.proposer.propose(
        ProposeRequest(
            count=config.proposer_steps * proposer.groups_per_step,
            backend="llm",
            group_size=proposer.group_size,
            difficulty=proposer.difficulty,
            max_ops=proposer.max_ops,
            device=config.device,
            temperature=proposer.temperature,
            max_tokens=proposer.max_completion_tokens,
            seed=config.seed + 7919 * round_index,
        ),
        wait_s=config.generation_timeout_s,
    )
    if proposed.job_status != "succeeded" or proposed.result is None:
        raise LoopError(f"the Proposer's sampling did not finish ({proposed.job_status}): {proposed.error or 'no result'}")
    summary = proposed.result
    progress.advance()
    seconds["propose"] = time.perf_counter() - started

    started = time.perf_counter()
    rates = coder_pass_rates(config, services, summary, progress, cancelled)
    seconds["measure"] = time.perf_counter() - started
    shape = FrontierConfig(shape=proposer.frontier_shape, width=proposer.frontier_width)
    rewards: list[float] = []
    for group in range(len(summary.prompts)):
        samples = proposer_samples(
            summary,
            group,
            lambda messages: render_prompt(trainer.tokenizer, messages),
            rates,
            lambda p: frontier_reward(p, shape),
            proposer.invalid_penalty,
        )
        record_group(ROLE, samples, group_id=f"{proposed.job_id}/g{group}", job_id=proposed.job_id, model_version_id=serving.id)
        rewards += [s.reward for s in samples if s.status != UNSCORED and s.reward is not None]

    started = time.perf_counter()
    reports: list[StepReport] = []
    dropped: Counter[str] = Counter()
    progress.phase("training the Proposer", config.proposer_steps)
    for step in range(config.proposer_steps):
        if cancelled():
            raise Cancelled
        claim = claim_groups(
            key,
            ROLE,
            max_groups=proposer.groups_per_step,
            group_size=proposer.group_size,
            current_version=serving.id,
            max_staleness=proposer.max_staleness,
        )
        dropped.update(claim.dropped)
        if not claim.groups:
            break
        report = trainer.step(claim.groups)
        reports.append(report)
        recorder.step(
            round_index,
            step,
            {**asdict(report), "tokens_per_second": report.tokens_per_second, "dropped": dict(claim.dropped)},
            ROLE,
        )
        progress.advance()
    seconds["train"] = time.perf_counter() - started

    started = time.perf_counter()
    published = None
    path = checkpoint
    if reports:
        published = publish_version(
            ROLE, trainer.save, store, services.proposer.switch_model, base_model=proposer.model_path, adapter=adapter, origin=key
        )
        path = version_path(published) or path
    seconds["publish"] = time.perf_counter() - started
    recorder.round(round_index, half_metrics(summary, rates, rewards, reports, dropped, serving, published, seconds), ROLE)
    return ProposerOutcome(path, published)


def serve_policy(config: ProposerRLConfig, proposer: ProposerClient) -> ServingModel:
    """The version the Proposer samples with; where it serves none yet, the run's base model is switched
    in first, so the policy sampled is the one trained."""
    serving = proposer.serving_model()
    if serving.id is None:
        serving = proposer.switch_model(ModelSwitch(name=config.model_path.name, base_model=str(config.model_path)))
    return serving


def coder_pass_rates(
    config: LoopConfig,
    services: Services,
    summary: ProposeSummary,
    progress: Progress,
    cancelled: Callable[[], bool],
) -> dict[str, float | None]:
    """The frozen Coder's pass rate on each valid new module: k candidates each through its queue (all
    submitted first), judged by the reward service."""
    proposer = config.proposer
    assert proposer is not None
    modules = {p.task_id: p for p in summary.proposals if p.status == "valid" and p.task_id is not None}
    sampling = Sampling(
        n=proposer.coder_samples, temperature=config.coder.temperature, top_p=config.top_p, max_tokens=config.max_tokens
    )
    scoring = ScoringIn(device=config.device, timeout_s=config.scoring_timeout_s)
    jobs = []
    for index, task_id in enumerate(sorted(modules)):
        request = KernelRequest(
            module=services.proposer.task(task_id).source,
            backend=config.backend,
            n=proposer.coder_samples,
            wait_s=0,
            model_backend=config.model_backend,
            sampling=sampling.model_copy(update={"seed": config.seed + 104_729 * (index + 1)}),
            scoring=scoring,
        )
        jobs.append((task_id, services.coder.generate(request).job_id))
    progress.phase("the Coder on the new modules", len(jobs))
    rates: dict[str, float | None] = {}
    for task_id, job_id in jobs:
        if cancelled():
            raise Cancelled
        rates[task_id] = pass_rate(await_kernel(services.coder, job_id, config.generation_timeout_s))
        progress.advance()
    return rates


def half_metrics(
    summary: ProposeSummary,
    rates: dict[str, float | None],
    rewards: list[float],
    reports: list[StepReport],
    dropped: Counter[str],
    served: ServingModel,
    published: ServingModel | None,
    seconds: dict[str, float],
) -> dict[str, Any]:
    statuses = Counter(p.status for p in summary.proposals)
    samples = sum(statuses.values())
    measured = [r for r in rates.values() if r is not None]
    losses = [r.loss for r in reports]
    return {
        "groups": len(summary.prompts),
        "samples": samples,
        "valid_fraction": statuses["valid"] / samples if samples else None,
        "statuses": dict(statuses),
        "rejections": summary.reasons,
        "modules_measured": len(measured),
        "coder_pass_rate_mean": statistics.fmean(measured) if measured else None,
        "reward_mean": statistics.fmean(rewards) if rewards else None,
        "reward_std": statistics.pstdev(rewards) if rewards else None,
        "steps": len(reports),
        "loss_mean": statistics.fmean(losses) if losses else None,
        "clip_fraction": statistics.fmean([r.clip_fraction for r in reports]) if reports else None,
        "tokens_per_second": statistics.fmean([r.tokens_per_second for r in reports]) if reports else None,
        "step_seconds": statistics.fmean([r.seconds for r in reports]) if reports else None,
        "dropped": dict(dropped),
        "sampled_with": served.name,
        "published": published.name if published else None,
        "published_id": published.id if published else None,
        "seconds": seconds,
    }
