"""Best-of-n: generate n candidates, score them through the reward service, keep the best verified one.

The same steps serve the Coder worker (scoring over HTTP, the reward service persists), the
``kernelzero generate`` command and the evaluation harness (scoring in a local sandboxed
``Evaluator``). Untrusted candidates never run here: a ``Scorer`` hands them to the sandbox.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

from coder_svc.drafts import KernelBackend, KernelDraft, KernelGenerator
from reward_svc import Evaluator, score_group
from services.clients.reward import RewardClient
from services.llm.chat import Sampling
from services.schemas.coder import CandidateReport, JobSeconds, KernelResult
from services.schemas.reward import GroupResult, GroupScoreRequest, ScoreOptions


@dataclass(frozen=True)
class Scored:
    """A group's verdicts, in candidate order, and the reward job that produced them (HTTP only)."""

    result: GroupResult
    reward_job_id: str | None = None


class Scorer(Protocol):
    def score(self, reference: str, candidates: list[str], options: ScoreOptions) -> Scored: ...


class ScoringFailed(RuntimeError):
    pass


class RewardServiceScorer:
    """Scores through the reward service's HTTP API; the service stores tasks, candidates and scores."""

    def __init__(self, client: RewardClient, wait_s: float = 1500.0, deadline: float | None = None) -> None:
        """``deadline`` (``time.monotonic()``) caps the wait: a job must end with a verdict or a
        clear ``ScoringFailed`` before its own time limit stops it."""
        self.client = client
        self.wait_s = wait_s
        self.deadline = deadline

    def score(self, reference: str, candidates: list[str], options: ScoreOptions) -> Scored:
        wait_s = self.wait_s if self.deadline is None else max(1.0, min(self.wait_s, self.deadline - time.monotonic()))
        response = self.client.score_group(reference, candidates, options, wait_s=wait_s)
        if response.result is None:
            raise ScoringFailed(f"reward job {response.job_id} {response.job_status}: {response.error or 'no result in time'}")
        return Scored(response.result, response.job_id)


class LocalScorer:
    """Scores in this machine's sandboxed children (the CLI and the harness); nothing is stored."""

    def __init__(self, evaluator: Evaluator) -> None:
        self.evaluator = evaluator

    def score(self, reference: str, candidates: list[str], options: ScoreOptions) -> Scored:
        request = GroupScoreRequest(reference=reference, candidates=candidates, options=options)
        return Scored(score_group(request, self.evaluator))


def score_drafts(
    reference: str, drafts: list[KernelDraft], scorer: Scorer, options: ScoreOptions
) -> tuple[list[CandidateReport], Scored | None]:
    """A report per draft. Drafts without code keep their reason unscored; identical sources are
    scored once (a deterministic generator repeats itself) and share the verdict."""
    unique = list(dict.fromkeys(d.source for d in drafts if d.source is not None))
    scored = scorer.score(reference, unique, options) if unique else None
    verdict_of = dict(zip(unique, scored.result.verdicts)) if scored else {}
    reports = [
        CandidateReport(
            index=i,
            model=d.model,
            model_version=d.model_version,
            source=d.source,
            declined=d.declined if d.source is None else None,
            verdict=verdict_of.get(d.source) if d.source is not None else None,
            details={k: v for k, v in d.details.items() if k != "prompt"},  # the result holds it once
            reply=d.raw if d.tokens is not None else None,
            tokens=d.tokens,
        )
        for i, d in enumerate(drafts)
    ]
    return reports, scored


def pick_best(reports: list[CandidateReport]) -> CandidateReport | None:
    """Correct first, then the highest speedup (unmeasured ranks below measured), then reward, then order."""
    correct = [r for r in reports if r.verdict is not None and r.verdict.correct]
    if not correct:
        return None

    def rank(r: CandidateReport) -> tuple[bool, float, float, int]:
        assert r.verdict is not None
        return (r.verdict.speedup is not None, r.verdict.speedup or 0.0, r.verdict.reward, -r.index)

    return max(correct, key=rank)


def summarize(reports: list[CandidateReport], backend: KernelBackend, generator_name: str, scored: Scored | None) -> KernelResult:
    best = pick_best(reports)
    verdicts = [r.verdict for r in reports if r.verdict is not None]
    model = next((r.model for r in reports), generator_name)
    if best is not None and best.verdict is not None:
        reason = best.verdict.reason
    elif not verdicts:
        reasons = sorted({r.declined or "no code in the reply" for r in reports})
        reason = f"no candidate to score: {'; '.join(reasons)}"
    else:
        statuses = ", ".join(f"{s} {sum(v.status == s for v in verdicts)}" for s in sorted({v.status for v in verdicts}))
        reason = f"no correct candidate among {len(verdicts)} scored ({statuses}); first: {verdicts[0].reason}"
    return KernelResult(
        correct=best is not None,
        kernel=best.source if best else None,
        best_index=best.index if best else None,
        speedup=best.verdict.speedup if best and best.verdict else None,
        reason=reason,
        model=model,
        backend=backend,
        candidates=reports,
        correct_fraction=sum(v.correct for v in verdicts) / len(reports) if reports else 0.0,
        reward_job_id=scored.reward_job_id if scored else None,
    )


def best_of_n(
    generator: KernelGenerator,
    module_source: str,
    backend: KernelBackend,
    sampling: Sampling,
    scorer: Scorer,
    options: ScoreOptions,
) -> KernelResult:
    """Generate ``sampling.n`` candidates, score them, return the best verified one with every verdict."""
    started = time.perf_counter()
    drafts = generator.generate(module_source, backend, sampling)
    sampled = time.perf_counter() - started
    return best_of_drafts(drafts, module_source, backend, generator.name, scorer, options, sample_seconds=sampled)


def best_of_drafts(
    drafts: list[KernelDraft],
    module_source: str,
    backend: KernelBackend,
    generator_name: str,
    scorer: Scorer,
    options: ScoreOptions,
    sample_seconds: float = 0.0,
) -> KernelResult:
    """Score drafts already generated (the Coder's job keeps them for its next attempt), pick the best;
    ``sample_seconds``: what drawing them took, for the result's account of its time."""
    started = time.perf_counter()
    reports, scored = score_drafts(module_source, drafts, scorer, options)
    result = summarize(reports, backend, generator_name, scored)
    result.prompt = next((d.details["prompt"] for d in drafts if "prompt" in d.details), None)
    result.seconds = JobSeconds(sample=sample_seconds, score=time.perf_counter() - started)
    return result
