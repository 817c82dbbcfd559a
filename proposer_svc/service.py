"""The proposer's logic behind its routes, its Celery task and its CLI: mine, propose, list, frontier.

A proposal round: sample API sets from the mined co-occurrence statistics (biased toward APIs
the Coder fails on), compose a module for each, validate every module in the sandbox, and store
each as a task, rejected ones with their reason. ``Task.source_hash`` is the SHA-256 of the exact
source, the key the reward service files its verdicts under, so the Coder's scores find the task;
the validator's normalised-source hash (``details.normalised_hash``) and the op-graph hash
(``graph_hash``) catch duplicates that differ in names or layout.
"""

from __future__ import annotations

import ast
import importlib.util
import random
import secrets
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from itertools import combinations
from pathlib import Path
from typing import Any

import structlog
from pydantic import TypeAdapter
from sqlalchemy import func, or_, select
from sqlalchemy.exc import IntegrityError

from proposer_svc.catalog import CATALOG
from proposer_svc.compose.base import Composer, ProposalHints, ProposedModule
from proposer_svc.composer_model import composer_chat_model
from proposer_svc.frontier import (
    POOL_STATUSES,
    FrontierConfig,
    api_failure_rates,
    pass_rate_histogram,
    select_frontier,
    task_pass_rates,
)
from proposer_svc.mining import DEFAULT_CORPUS, MiningResult, default_corpus, directory_corpus, load_stats, mine, save_stats
from proposer_svc.sampling import sample_api_set
from proposer_svc.stats import ApiStats
from proposer_svc.validate import ValidationOptions, ValidationResult, Validator
from proposer_svc.validate import source_hash as normalised_hash
from services.config import Settings, get_settings
from services.db.models import Job, Task
from services.db.serving import serving_version
from services.db.session import session_scope
from services.db.tasks import source_sha256
from services.llm.chat import Message, Sampling
from services.outcomes import Declined
from services.queue.faults import fault_point
from services.queue.jobs import checkpointed, submit_job
from services.queue.names import PROPOSAL, PROPOSE_TASK
from services.schemas.proposer import (
    ComposerName,
    FrontierOut,
    FrontierTaskOut,
    ProposalOut,
    ProposeRequest,
    ProposeSummary,
    SampledReply,
    TaskOut,
    TaskPage,
)

log = structlog.get_logger(__name__)

COMPOSE_ATTEMPTS = 5  # fresh API sets tried before a slot counts as declined
Progress = Callable[[str, int, int], None]  # (phase, done, total)


# --- statistics ------------------------------------------------------------------------------


def mine_corpus(name: str = DEFAULT_CORPUS, directories: Iterable[Path] = (), show_progress: bool = False) -> MiningResult:
    """Mine the named directories (or the default corpus) and store the result under ``name``."""
    dirs = list(directories)
    sources = directory_corpus(dirs) if dirs else default_corpus()
    result = mine(sources, show_progress=show_progress)
    save_stats(name, result, sources)
    log.info(
        "proposer.mined",
        corpus=name,
        files=result.files,
        modules=result.stats.modules,
        apis=len(result.stats.usage),
        pairs=len(result.stats.pairs),
        skipped=len(result.skipped),
    )
    return result


def sampling_stats(settings: Settings) -> tuple[ApiStats, str | None]:
    """The configured corpus's statistics; the default corpus is mined on first use. With none,
    sampling is uniform over the catalog (a warning says so)."""
    name = settings.proposer_corpus
    stats = load_stats(name)
    if stats is None and name == DEFAULT_CORPUS:
        try:
            stats = mine_corpus(name).stats
        except Exception as exc:  # no transformers, unreadable site-packages: degrade, do not fail the round
            log.warning("proposer.mining_failed", corpus=name, error=f"{type(exc).__name__}: {exc}")
    if stats is None or not stats.usage:
        log.warning("proposer.uniform_sampling", corpus=name, why="no mined statistics under this name")
        return ApiStats(), None
    return stats, name


# --- proposing -------------------------------------------------------------------------------


class ComposerUnavailable(ValueError):
    """The requested composer cannot run in this deployment; the message says what is missing."""


def check_composer(name: ComposerName, settings: Settings) -> None:
    if name == "llm" and settings.coder_model_backend == "template":
        raise ComposerUnavailable("the llm composer needs a model: set KZ_CODER_MODEL_BACKEND to openai or hf")
    if name == "llm" and importlib.util.find_spec("proposer_svc.compose.llm") is None:
        raise ComposerUnavailable("the llm composer is not part of this build")


def build_composer(name: ComposerName, settings: Settings) -> Composer:
    check_composer(name, settings)
    if name == "composer":
        from proposer_svc.compose.programmatic import ProgrammaticComposer

        return ProgrammaticComposer()
    from proposer_svc.compose.llm import LLMComposer

    backend = settings.coder_model_backend
    assert backend != "template", "check_composer refused the llm composer without a model"
    return LLMComposer(composer_chat_model(backend, settings))


def compose_modules(
    composer: Composer,
    stats: ApiStats,
    request: ProposeRequest,
    settings: Settings,
    rng: random.Random,
    on_progress: Progress | None = None,
) -> tuple[list[ProposedModule], list[ProposalOut]]:
    """``count`` modules from sampled API sets; slots whose API sets the composer kept declining."""
    failure_rates = api_failure_rates(task_pass_rates()) if settings.proposer_failure_bias > 0 else None
    size = request.api_set_size or settings.proposer_api_set_size
    hints = ProposalHints(difficulty=request.difficulty, max_ops=request.max_ops)
    modules: list[ProposedModule] = []
    declined: list[ProposalOut] = []
    for i in range(request.count):
        reason, api_set = "", []
        for _ in range(COMPOSE_ATTEMPTS):
            api_set = sample_api_set(
                stats,
                CATALOG,
                size,
                rng,
                temperature=settings.proposer_sample_temperature,
                failure_rates=failure_rates,
                failure_bias=settings.proposer_failure_bias,
            )
            try:
                modules.append(composer.compose(api_set, replace(hints, seed=rng.randrange(2**31))))
                break
            except Declined as exc:
                reason = str(exc)
        else:
            declined.append(
                ProposalOut(
                    status="declined", reason=f"composer declined {COMPOSE_ATTEMPTS} API sets; last: {reason}", api_set=api_set
                )
            )
        if on_progress:
            on_progress("compose", i + 1, request.count)
    return modules, declined


def known_hashes(job_id: str | None = None) -> set[str]:
    """Normalised-source and graph hashes of the pool, for the validator's duplicate check; without the
    tasks ``job_id`` stored itself (an earlier attempt's modules are not duplicates of this round's)."""
    query = select(Task.source, Task.graph_hash, Task.details).where(Task.status.in_(POOL_STATUSES))
    if job_id is not None:
        query = query.where(or_(Task.job_id.is_(None), Task.job_id != job_id))
    with session_scope() as session:
        rows = session.execute(query).all()
    hashes: set[str] = set()
    for source, graph, details in rows:
        if graph:
            hashes.add(graph)
        normalised = (details or {}).get("normalised_hash")
        if normalised is None:  # a task the reward service stored: hash it here
            try:
                normalised = normalised_hash(ast.parse(source))
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                continue
        hashes.add(normalised)
    return hashes


def store_task(
    module: ProposedModule, verdict: ValidationResult, request: ProposeRequest, job_id: str | None = None
) -> ProposalOut:
    details: dict[str, Any] = {
        **module.details,
        "normalised_hash": verdict.source_hash,
        "rule": verdict.rule,
        "device": verdict.device,
        "validation": verdict.details,
        "hints": {"difficulty": request.difficulty, "max_ops": request.max_ops},
    }
    details["origin"] = module.origin  # in full: the column keeps 50 characters
    task = Task(
        source=module.source,
        source_hash=source_sha256(module.source),
        origin=module.origin[:50],
        api_set=module.api_set,
        input_shapes=module.input_shapes or verdict.details.get("input_shapes"),
        status="valid" if verdict.valid else "rejected",
        reason=verdict.reason,
        graph_hash=verdict.graph_hash,
        details=details,
        job_id=job_id,
    )
    try:
        with session_scope() as session:
            session.add(task)
    except IntegrityError:  # a concurrent round stored the same source first
        return ProposalOut(status="exists", reason="this exact source is already a task", api_set=module.api_set)
    fault_point("propose.after_store")
    return stored_outcome(task)


def stored_outcome(task: Task) -> ProposalOut:
    """What became of a module, as its task row says."""
    status = "valid" if task.status == "valid" else "rejected"
    rule = (task.details or {}).get("rule")
    return ProposalOut(task_id=task.id, status=status, reason=task.reason or "", rule=rule, api_set=list(task.api_set or []))


@dataclass(frozen=True)
class Drafted:
    """A composed module on its way to validation, with where it came from in a sampled group."""

    module: ProposedModule
    group: int | None = None
    reply: SampledReply | None = None

    def outcome(self, proposal: ProposalOut) -> ProposalOut:
        return proposal.model_copy(update={"group": self.group, "reply": self.reply})


@dataclass(frozen=True)
class Drafts:
    """A round's composing, kept as a proposal job's checkpoint: the prompts of its sampled groups, the
    modules drafted, the slots the composer declined, the corpus its API sets were sampled from."""

    prompts: list[list[Message]]
    drafted: list[Drafted]
    declined: list[ProposalOut]
    corpus: str | None


DRAFTS = TypeAdapter(Drafts)


def sample_groups(
    composer: Composer,
    stats: ApiStats,
    request: ProposeRequest,
    settings: Settings,
    rng: random.Random,
    on_progress: Progress | None = None,
) -> tuple[list[list[Message]], list[Drafted], list[ProposalOut]]:
    """Proposer RL groups: ``count`` sampled API sets, ``group_size`` replies to each one's prompt, every
    reply kept (a reply without a module is a declined proposal, not retried): the prompts, the modules,
    the declined."""
    from proposer_svc.compose.llm import LLMComposer

    if not isinstance(composer, LLMComposer):
        raise ComposerUnavailable("sampled groups (group_size > 1) need the llm composer")
    failure_rates = api_failure_rates(task_pass_rates()) if settings.proposer_failure_bias > 0 else None
    size = request.api_set_size or settings.proposer_api_set_size
    sampling = Sampling(
        n=request.group_size,
        temperature=1.0 if request.temperature is None else request.temperature,
        top_p=1.0,  # the policy the trainer's loss assumes
        max_tokens=request.max_tokens or composer.sampling.max_tokens,
        logprobs=True,
    )
    prompts: list[list[Message]] = []
    drafted: list[Drafted] = []
    declined: list[ProposalOut] = []
    for index in range(request.count):
        api_set = sample_api_set(
            stats,
            CATALOG,
            size,
            rng,
            temperature=settings.proposer_sample_temperature,
            failure_rates=failure_rates,
            failure_bias=settings.proposer_failure_bias,
        )
        hints = ProposalHints(difficulty=request.difficulty, max_ops=request.max_ops, seed=rng.randrange(2**31))
        messages, group = composer.sample_group(api_set, hints, sampling)
        prompts.append(messages)
        for sample in group:
            drawn = sample.completion
            reply = SampledReply(text=drawn.text, model_version=drawn.model_version, tokens=drawn.tokens)
            if sample.module is not None:
                drafted.append(Drafted(sample.module, index, reply))
            else:
                declined.append(
                    ProposalOut(status="declined", reason=sample.declined or "", api_set=list(api_set), group=index, reply=reply)
                )
        if on_progress:
            on_progress("compose", index + 1, request.count)
    return prompts, drafted, declined


def propose(
    request: ProposeRequest,
    settings: Settings | None = None,
    parallel: int = 1,
    on_progress: Progress | None = None,
    job_id: str | None = None,
) -> ProposeSummary:
    """One proposal round: sample, compose, validate in the sandbox, store every outcome. In sampled
    groups (``group_size`` > 1) a module repeated within the round shares its first copy's outcome.

    Run as ``job_id``, the round is the job's whatever the attempt: the drafts are its checkpoint (an
    attempt run again validates the modules the first one drew) and a module an earlier attempt
    stored keeps the outcome stored with it, not "exists"."""
    settings = settings or get_settings()
    started = time.monotonic()

    def compose_round() -> Drafts:
        rng = random.Random(request.seed)
        stats, corpus = sampling_stats(settings)
        composer = build_composer(request.backend or settings.proposer_composer, settings)
        if request.group_size > 1:
            return Drafts(*sample_groups(composer, stats, request, settings, rng, on_progress), corpus)
        modules, declined = compose_modules(composer, stats, request, settings, rng, on_progress)
        return Drafts([], [Drafted(m) for m in modules], declined, corpus)

    drafts = compose_round() if job_id is None else checkpointed(job_id, "drafts", compose_round, DRAFTS)
    proposals = list(drafts.declined)

    with session_scope() as session:
        hashes = [source_sha256(d.module.source) for d in drafts.drafted]
        rows = session.scalars(select(Task).where(Task.source_hash.in_(hashes))).all()
        stored = {t.source_hash for t in rows}
        mine = {t.source_hash: stored_outcome(t) for t in rows if job_id is not None and t.job_id == job_id}
    fresh: list[Drafted] = []
    outcomes: list[ProposalOut | None] = []  # per fresh module: its outcome where an earlier attempt stored it
    first: dict[str, int] = {}  # a source's first copy in this round: its index in fresh
    repeats: list[tuple[Drafted, int]] = []
    for draft, digest in zip(drafts.drafted, hashes):
        if digest in first and request.group_size > 1:
            repeats.append((draft, first[digest]))
        elif (digest in stored and digest not in mine) or digest in first:
            exists = ProposalOut(status="exists", reason="this exact source is already a task", api_set=draft.module.api_set)
            proposals.append(draft.outcome(exists))
        else:
            first[digest] = len(fresh)
            fresh.append(draft)
            outcomes.append(mine.get(digest))

    pending = [i for i, outcome in enumerate(outcomes) if outcome is None]
    done: list[int] = []

    def validated(i: int, _: ValidationResult) -> None:
        done.append(i)
        if on_progress:
            on_progress("validate", len(done), len(pending))

    if pending:
        with Validator(ValidationOptions(device=request.device), settings) as validator:
            sources = [fresh[i].module.source for i in pending]
            verdicts = validator.validate_many(sources, known_hashes(job_id), parallel, validated)
        for i, verdict in zip(pending, verdicts):
            outcomes[i] = store_task(fresh[i].module, verdict, request, job_id)
    settled = [d.outcome(o) for d, o in zip(fresh, outcomes) if o is not None]
    assert len(settled) == len(fresh), "each fresh module was stored now or found stored by an earlier attempt"
    proposals += settled + [draft.outcome(settled[i]) for draft, i in repeats]
    summary = summarize(request, proposals, drafts.corpus, time.monotonic() - started)
    return summary.model_copy(update={"prompts": drafts.prompts})


def summarize(request: ProposeRequest, proposals: list[ProposalOut], corpus: str | None, seconds: float) -> ProposeSummary:
    statuses = Counter(p.status for p in proposals)
    valid_sets = [sorted(set(p.api_set)) for p in proposals if p.status == "valid"]
    return ProposeSummary(
        requested=request.count,
        valid=statuses["valid"],
        rejected=statuses["rejected"],
        declined=statuses["declined"],
        exists=statuses["exists"],
        reasons=dict(Counter(p.rule or "unknown" for p in proposals if p.status == "rejected")),
        apis_covered=len({a for s in valid_sets for a in s}),
        pairs_covered=len({pair for s in valid_sets for pair in combinations(s, 2)}),
        corpus=corpus,
        seconds=round(seconds, 3),
        proposals=proposals,
    )


def submit_propose(request: ProposeRequest) -> Job:
    """Queue a round (``ComposerUnavailable`` before queueing when its composer cannot run).
    Without a seed one is drawn here, so a repeated request is a new round rather than the
    idempotent replay of the last one. The llm composer's serving version is part of the input, as
    the Coder's is of its jobs: asked again after a switch, the same request is a new job."""
    settings = get_settings()
    composer = request.backend or settings.proposer_composer
    check_composer(composer, settings)
    if request.group_size > 1 and composer != "llm":
        raise ComposerUnavailable(f"sampled groups (group_size > 1) need the llm composer, not the {composer!r} one")
    payload = request.model_dump(exclude={"wait_s"})
    if payload["seed"] is None:
        payload["seed"] = secrets.randbelow(2**31)
    if composer == "llm":
        version = serving_version("proposer")
        payload["serving_version"] = version.id if version else None
    return submit_job(PROPOSE_TASK, payload, PROPOSAL)


def run_propose_job(job_id: str, payload: dict[str, Any]) -> dict[str, Any]:
    """The Celery job body: one round, its summary stored on the job."""
    summary = propose(ProposeRequest.model_validate(payload), job_id=job_id)
    log.info("proposer.round", job_id=job_id, valid=summary.valid, rejected=summary.rejected, declined=summary.declined)
    return summary.model_dump()


# --- the task pool and the frontier ------------------------------------------------------------


def list_tasks(status: str | None = None, origin: str | None = None, limit: int = 50, offset: int = 0) -> TaskPage:
    query = select(Task)
    if status is not None:
        query = query.where(Task.status == status)
    if origin is not None:
        query = query.where(Task.origin == origin)
    with session_scope() as session:
        total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
        rows = session.scalars(query.order_by(Task.created_at.desc(), Task.id).limit(limit).offset(offset)).all()
        items = [TaskOut.model_validate(t) for t in rows]
    return TaskPage(items=items, total=total, limit=limit, offset=offset)


def get_task(task_id: str) -> TaskOut | None:
    with session_scope() as session:
        task = session.get(Task, task_id)
        return TaskOut.model_validate(task) if task is not None else None


def frontier(count: int = 20, bins: int = 10, settings: Settings | None = None) -> FrontierOut:
    """The pool's pass-rate histogram and the next round's tasks near the frontier."""
    config = FrontierConfig.from_settings(settings)
    rates = task_pass_rates()
    edges, counts = pass_rate_histogram(rates, bins, config.min_attempts)
    api_sets = {r.task_id: list(r.api_set) for r in rates}
    tasks = [
        FrontierTaskOut(
            task_id=t.task_id,
            pass_rate=t.pass_rate,
            attempts=t.attempts,
            reward=t.reward,
            explored=t.explored,
            api_set=api_sets[t.task_id] or None,
        )
        for t in select_frontier(rates, count, config)
    ]
    return FrontierOut(
        shape=config.shape,
        width=config.width,
        min_attempts=config.min_attempts,
        pool_tasks=len(rates),
        scored_tasks=sum(counts),
        bin_edges=edges,
        histogram=counts,
        tasks=tasks,
    )
