"""The Coder service's logic behind its routes and its Celery job: submit, generate, score, persist, follow
the serving model version (switched through ``services.api.routes_serving``)."""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import structlog
from pydantic import TypeAdapter
from sqlalchemy import select

from coder_svc.best_of_n import RewardServiceScorer, best_of_drafts
from coder_svc.drafts import KernelDraft, KernelGenerator
from services.clients.reward import RewardClient
from services.config import Settings, get_settings
from services.db.models import Candidate, Job, Score
from services.db.serving import Role, ServingVersion, serving_version
from services.db.session import session_scope
from services.db.tasks import ensure_task, source_sha256
from services.llm.chat import Sampling
from services.metrics import record_served_version
from services.queue.faults import fault_point
from services.queue.jobs import JobNotFound, checkpointed, get_job, submit_job
from services.queue.names import GENERATE_TASK, GENERATION
from services.schemas.coder import KernelRequest, KernelResponse, KernelResult
from services.schemas.reward import ScoreOptions
from services.schemas.serving import ModelBackend

log = structlog.get_logger(__name__)

TASK_ORIGIN = "coder-request"
CODER_ROLE: Role = "coder"
DRAFTS = TypeAdapter(list[KernelDraft])


# --- jobs -----------------------------------------------------------------------------------


def submit(request: KernelRequest) -> Job:
    """Queue a generation. The serving model version is part of the input: the same module asked
    again after a model switch is a new job, asked again under the same model is the same job."""
    version = serving_version(CODER_ROLE)
    payload = {**request.model_dump(exclude={"wait_s"}), "serving_version": version.id if version else None}
    return submit_job(GENERATE_TASK, payload, GENERATION)


def kernel_response(job: Job) -> KernelResponse:
    return KernelResponse(
        job_id=job.id,
        job_status=job.status,
        error=job.error,
        result=KernelResult.model_validate(job.result) if job.result else None,
    )


def generation_job(job_id: str) -> Job:
    """A generation job by id; ``JobNotFound`` for unknown ids and for other services' jobs."""
    job = get_job(job_id)
    if job.kind != GENERATE_TASK:
        raise JobNotFound(job_id)
    return job


def run_generate_job(generators: GeneratorCache, job_id: str, payload: dict[str, Any]) -> dict[str, Any]:
    """The Celery job body: generate n candidates, score them over HTTP, link them to the task.

    The candidates are the job's checkpoint: an attempt run again after its worker died scores the
    ones the first attempt drew, so the reward service finds its job for them (done, or running) and
    the job ends with one scored group, not one per attempt."""
    request = KernelRequest.model_validate(payload)
    settings = get_settings()
    # Leave a minute before Celery's soft limit, so a slow reward job ends as ScoringFailed, not a kill.
    deadline = time.monotonic() + settings.task_soft_time_limit_s - 60
    kind: ModelBackend = request.model_backend or settings.coder_model_backend
    version = serving_version(CODER_ROLE)  # read at the start of every job: an admin switch reaches the next job
    generator = generators.get(kind, version)
    ensure_task(request.module, TASK_ORIGIN)  # first, so the reward service files its candidates under this origin
    sampling = sampling_for(request.n, request.sampling, settings)
    started = time.perf_counter()  # this attempt's sampling: none where an earlier attempt's drafts are reloaded
    drafts = checkpointed(job_id, "drafts", lambda: generator.generate(request.module, request.backend, sampling), DRAFTS)
    sampled = time.perf_counter() - started
    fault_point("generate.after_drafts")
    options = ScoreOptions(backend=request.backend, **request.scoring.model_dump())
    with RewardClient() as client:
        scorer = RewardServiceScorer(client, wait_s=settings.task_soft_time_limit_s, deadline=deadline)
        result = best_of_drafts(drafts, request.module, request.backend, generator.name, scorer, options, sample_seconds=sampled)
    fault_point("generate.after_scoring")
    if kind != "template" and version is not None:
        result.model_version_id = version.id
    if result.reward_job_id is not None:
        link_candidates(result, job_id)
    return result.model_dump()


def sampling_for(n: int, requested: Sampling, settings: Settings) -> Sampling:
    """``n`` samples as requested; the fields the request left out take the service's defaults."""
    defaults = {"temperature": settings.coder_temperature, "top_p": settings.coder_top_p, "max_tokens": settings.coder_max_tokens}
    chosen = requested.model_dump(include=requested.model_fields_set - {"n"})
    return Sampling.model_validate({**defaults, **chosen, "n": n})


# --- persistence ----------------------------------------------------------------------------


def link_candidates(result: KernelResult, coder_job_id: str) -> None:
    """Add who wrote each candidate to the rows the reward service stored for this group (found
    through the reward job id): no second copy of a candidate, one row per distinct source."""
    drafts: dict[str, list[int]] = defaultdict(list)
    for report in result.candidates:
        if report.source is not None:
            drafts[source_sha256(report.source)].append(report.index)
    first = {digest: result.candidates[indices[0]] for digest, indices in drafts.items()}
    with session_scope() as session:
        rows = session.scalars(select(Candidate).join(Score).where(Score.job_id == result.reward_job_id)).all()
        for row in rows:
            drafted = first.get(row.source_hash)
            if drafted is None:
                continue
            name = f"{drafted.model}@{drafted.model_version}" if drafted.model_version else drafted.model
            row.model_name = name[:500]  # the column's width; the full version stays in details
            row.model_version_id = result.model_version_id
            row.details = {
                **(row.details or {}),
                "coder_job_id": coder_job_id,
                "draft_indices": drafts[row.source_hash],
                "generator": report.details,
                "prompt": result.prompt,
            }


# --- serving model --------------------------------------------------------------------------


class GeneratorCache:
    """A worker's generators, one per backend, kept across jobs and brought in line with the
    serving version when it changed (an adapter switch where the backend can, a rebuild otherwise)."""

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or get_settings()
        self._generators: dict[str, KernelGenerator] = {}
        self._versions: dict[str, str | None] = {}

    def get(self, kind: ModelBackend, version: ServingVersion | None) -> KernelGenerator:
        from coder_svc.generators import build_generator  # model libraries load in the worker only

        version_id = version.id if version else None
        if kind not in self._generators:
            self._generators[kind] = build_generator(kind, self.settings)
            self._versions[kind] = None
        if kind != "template" and self._versions[kind] != version_id and version is not None:
            self._generators[kind] = apply_version(self._generators[kind], kind, version, self.settings)
            log.info("coder.generator_adjusted", backend=kind, version=version_id, name=version.name)
        self._versions[kind] = version_id
        record_served_version("coder", kind, version.name if version and kind != "template" else None)
        return self._generators[kind]


def apply_version(generator: KernelGenerator, kind: ModelBackend, version: ServingVersion, settings: Settings) -> KernelGenerator:
    """Serve ``version`` with this backend: a local model at another path is loaded anew; an
    adapter is loaded at runtime (peft, or vLLM's LoRA endpoint) and made the served model."""
    from coder_svc.generators import build_generator, switch_model

    if kind == "hf":
        target = Path(version.base_model) if version.base_model else settings.coder_hf_model_path
        if getattr(getattr(generator, "chat_model", None), "model_path", None) != target:
            generator = build_generator(
                "hf", settings.model_copy(update={"coder_hf_model_path": target, "coder_lora_path": None})
            )
    switch_model(generator, version.name, version.adapter_path, keep=settings.coder_adapters_kept)
    return generator
