"""Rollouts from the Coder's generation jobs and the Proposer's sampled groups.

A Coder job sampled for training (``sampling.logprobs``) holds,
per candidate, the model's whole reply, its token ids and the sampler's log-probabilities, and its
verdict and reward; ``record_coder_job`` stores them as one group, keyed by the job (a result read
twice, after a restart, is stored once).

What a candidate counts as: its verdict and reward where the reward service judged it; a reply with
no program in it is the model's failure (reward 0, status ``no_code``); a candidate the service could
not judge (``unverified``: no GPU where timing was asked for, or no verdict at all) is ``unscored``,
so its group stays out of the loss instead of teaching that the kernel was wrong.

A Proposer group (``ProposeRequest.group_size`` replies to one API set's prompt): a valid new module
earns the frontier reward of the Coder's pass rate on it; one that is declined, rejected or already a
task earns the penalty ρ; a valid one the Coder's candidates could not be judged on is ``unscored``.
"""

from __future__ import annotations

from collections.abc import Callable

from reward_svc import group_rewards
from services.llm.chat import Message
from services.schemas.coder import CandidateReport, KernelResult
from services.schemas.proposer import ProposeSummary
from services.schemas.reward import CAGRPOConfig
from trainer.rollouts import UNSCORED, Sample, record_group

NO_CODE = "no_code"


class IntakeError(ValueError):
    """A generation result that cannot become rollouts (no prompt to train on)."""


def coder_samples(
    result: KernelResult, render: Callable[[list[Message]], str], ca_grpo: CAGRPOConfig | None = None
) -> list[Sample]:
    """One sample per candidate, in order. ``render`` turns the job's messages into the prompt text with
    the trained model's chat template, where the backend did not report the text it rendered (vLLM).

    Where every candidate was judged, the rewards are the run's CA-GRPO (``ca_grpo``) over the whole
    group: the reward service scored each distinct source once, so its correct fraction (which turns
    the speed term on) left out replies with no program and counted repeats once."""
    rendered: str | None = None
    samples = []
    judged = [_judged(report) for report in result.candidates]
    if judged and all(status != UNSCORED for status, _ in judged):
        correct = [status == "correct" for status, _ in judged]
        speedups = [r.verdict.speedup if r.verdict is not None else None for r in result.candidates]
        judged = [(status, reward) for (status, _), reward in zip(judged, group_rewards(correct, speedups, ca_grpo).rewards)]
    for report, (status, reward) in zip(result.candidates, judged):
        tokens = report.tokens
        prompt = tokens.prompt if tokens is not None and tokens.prompt else None
        if prompt is None:
            if result.prompt is None:
                raise IntakeError("the generation result holds no prompt: it was not sampled through a chat model")
            rendered = rendered if rendered is not None else render(result.prompt)
            prompt = rendered
        samples.append(
            Sample(
                prompt=prompt,
                completion=report.reply if report.reply is not None else (report.source or ""),
                status=status,
                reward=reward,
                completion_ids=tokens.completion_ids if tokens is not None else None,
                behaviour_logps=tokens.logprobs if tokens is not None else None,
            )
        )
    return samples


def _judged(report: CandidateReport) -> tuple[str, float | None]:
    if report.verdict is None:
        return (NO_CODE, 0.0) if report.source is None else (UNSCORED, None)
    if report.verdict.status == "unverified":
        return UNSCORED, None
    return report.verdict.status, report.verdict.reward


def record_coder_job(
    job_id: str,
    result: KernelResult,
    render: Callable[[list[Message]], str],
    *,
    task_id: str | None = None,
    model_version_id: str | None = None,
    ca_grpo: CAGRPOConfig | None = None,
) -> str:
    """Store a training generation job's candidates as one rollout group (its id the job's)."""
    samples = coder_samples(result, render, ca_grpo)
    return record_group("coder", samples, group_id=job_id, task_id=task_id, job_id=job_id, model_version_id=model_version_id)


def pass_rate(result: KernelResult) -> float | None:
    """The Coder's correct fraction on one module, counted as its training groups are: a reply with no
    program is a failure, a candidate the service could not judge is left out; None where none was judged."""
    judged = [status for status, _ in map(_judged, result.candidates) if status != UNSCORED]
    return sum(status == "correct" for status in judged) / len(judged) if judged else None


def proposer_samples(
    summary: ProposeSummary,
    group: int,
    render: Callable[[list[Message]], str],
    pass_rates: dict[str, float | None],
    frontier_reward: Callable[[float], float],
    invalid_penalty: float,
) -> list[Sample]:
    """One Proposer group's samples: each reply with its module's reward (``pass_rates``: the Coder's, per
    valid task)."""
    samples = []
    rendered = render(summary.prompts[group])
    for proposal in (p for p in summary.proposals if p.group == group):
        reply = proposal.reply
        if reply is None:
            raise IntakeError(f"proposal of group {group} holds no reply: the round was not sampled for training")
        status: str = proposal.status
        reward: float | None = invalid_penalty
        if proposal.status == "valid" and proposal.task_id is not None:
            rate = pass_rates.get(proposal.task_id)
            status, reward = (UNSCORED, None) if rate is None else (status, frontier_reward(rate))
        tokens = reply.tokens
        samples.append(
            Sample(
                prompt=tokens.prompt if tokens is not None and tokens.prompt else rendered,
                completion=reply.text,
                status=status,
                reward=reward,
                completion_ids=tokens.completion_ids if tokens is not None else None,
                behaviour_logps=tokens.logprobs if tokens is not None else None,
            )
        )
    return samples
