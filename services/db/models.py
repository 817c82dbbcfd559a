"""The platform's tables. Redis holds queues only; every score and job lives here."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, Boolean, DateTime, Float, ForeignKey, Integer, String, Text, UniqueConstraint, false
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_id() -> str:
    return uuid.uuid4().hex


def derived_id(*parts: object) -> str:
    """The same id for the same parts (a job and an item index): an attempt of a job run again finds
    the rows an earlier attempt wrote instead of adding copies."""
    return uuid.uuid5(uuid.NAMESPACE_URL, "kernelzero:" + "/".join(map(str, parts))).hex


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(200))
    prefix: Mapped[str] = mapped_column(String(16), index=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    admin: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())  # may switch the serving model
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class Job(Base):
    """One unit of queued work. Its id is the Celery task id; its key makes submission idempotent."""

    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    kind: Mapped[str] = mapped_column(String(100), index=True)
    queue: Mapped[str] = mapped_column(String(100))
    idempotency_key: Mapped[str] = mapped_column(String(64), unique=True)
    status: Mapped[str] = mapped_column(String(20), default="queued", index=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text)
    worker: Mapped[str | None] = mapped_column(String(200))  # host:pid of the process running its attempt
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    enqueued_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))  # its latest message was sent
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The running attempt's process writes this every few seconds: the sweeper and a duplicate delivery
    # tell a live owner from a dead one by it.
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class JobCheckpoint(Base):
    """A value one attempt of a job computed and every later attempt reuses (the candidates a sampling
    job drew, say), so a job run again after its worker died repeats the same work, not new work."""

    __tablename__ = "job_checkpoints"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    step: Mapped[str] = mapped_column(String(100), primary_key=True)
    value: Mapped[Any] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Task(Base):
    """A KernelBench-format module: proposed by the Proposer or submitted as a reference."""

    __tablename__ = "tasks"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    source: Mapped[str] = mapped_column(Text)
    source_hash: Mapped[str] = mapped_column(String(64), unique=True)
    origin: Mapped[str] = mapped_column(String(50), default="external")
    api_set: Mapped[list[Any] | None] = mapped_column(JSON)
    input_shapes: Mapped[list[Any] | None] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(20), default="pending", index=True)
    reason: Mapped[str | None] = mapped_column(Text)
    # Hash of the traced op graph: two sources that differ only in names or layout collide here.
    graph_hash: Mapped[str | None] = mapped_column(String(64), index=True)
    details: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    job_id: Mapped[str | None] = mapped_column(String(36), index=True)  # the proposal job that stored it
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    candidates: Mapped[list[Candidate]] = relationship(back_populates="task")


class ModelVersion(Base):
    __tablename__ = "model_versions"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    role: Mapped[str] = mapped_column(String(20))  # coder | proposer
    name: Mapped[str] = mapped_column(String(200))
    base_model: Mapped[str | None] = mapped_column(String(500))
    adapter_path: Mapped[str | None] = mapped_column(String(1000))
    serving: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Candidate(Base):
    """A kernel (KernelBench ``ModelNew``) written for a task."""

    __tablename__ = "candidates"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    task_id: Mapped[str] = mapped_column(ForeignKey("tasks.id"), index=True)
    backend: Mapped[str] = mapped_column(String(20))  # cuda | triton
    source: Mapped[str] = mapped_column(Text)
    source_hash: Mapped[str] = mapped_column(String(64), index=True)
    model_version_id: Mapped[str | None] = mapped_column(ForeignKey("model_versions.id"))
    # The served model that wrote it (name and version as the backend reported them).
    model_name: Mapped[str | None] = mapped_column(String(500))
    details: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    task: Mapped[Task] = relationship(back_populates="candidates")
    scores: Mapped[list[Score]] = relationship(back_populates="candidate")


class Score(Base):
    """One verdict of the reward service with every number it measured."""

    __tablename__ = "scores"
    # One verdict per candidate of a scoring job, however often the job runs.
    __table_args__ = (UniqueConstraint("job_id", "item", name="uq_scores_job_item"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    candidate_id: Mapped[str] = mapped_column(ForeignKey("candidates.id"), index=True)
    job_id: Mapped[str | None] = mapped_column(ForeignKey("jobs.id"), index=True)
    item: Mapped[int | None] = mapped_column(Integer)  # the candidate's index in the job's group
    group_id: Mapped[str | None] = mapped_column(String(64), index=True)
    status: Mapped[str] = mapped_column(String(30))
    correct: Mapped[bool] = mapped_column(Boolean)
    reason: Mapped[str] = mapped_column(Text)
    guard: Mapped[str | None] = mapped_column(String(100))
    reward: Mapped[float | None] = mapped_column(Float)
    advantage: Mapped[float | None] = mapped_column(Float)
    speedup: Mapped[float | None] = mapped_column(Float)
    runtime_ms: Mapped[float | None] = mapped_column(Float)
    ref_runtime_ms: Mapped[float | None] = mapped_column(Float)
    max_abs_error: Mapped[float | None] = mapped_column(Float)
    device: Mapped[str | None] = mapped_column(String(100))
    details: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    candidate: Mapped[Candidate] = relationship(back_populates="scores")


class RolloutGroup(Base):
    """The samples of one prompt, scored together: what the trainer claims (whole, once) and trains on."""

    __tablename__ = "rollout_groups"

    id: Mapped[str] = mapped_column(String(64), primary_key=True, default=new_id)
    role: Mapped[str] = mapped_column(String(20))  # coder | proposer
    task_id: Mapped[str | None] = mapped_column(ForeignKey("tasks.id"), index=True)
    job_id: Mapped[str | None] = mapped_column(String(36), index=True)  # the job that sampled it
    model_version_id: Mapped[str | None] = mapped_column(ForeignKey("model_versions.id"))
    size: Mapped[int] = mapped_column(Integer)
    claimed_by: Mapped[str | None] = mapped_column(String(64), index=True)  # the training run that took it
    claimed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    dropped: Mapped[str | None] = mapped_column(String(40))  # why the run left it out: stale, no_signal, unscored
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, index=True)


class Rollout(Base):
    """One sample for training: the exact prompt text, the completion (text, token ids, the sampler's
    log-probs where the backend gave them), its verdict and reward, who wrote it."""

    __tablename__ = "rollouts"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    candidate_id: Mapped[str | None] = mapped_column(ForeignKey("candidates.id"), index=True)
    task_id: Mapped[str | None] = mapped_column(ForeignKey("tasks.id"), index=True)
    group_id: Mapped[str] = mapped_column(ForeignKey("rollout_groups.id"), index=True)
    prompt: Mapped[str] = mapped_column(Text)
    completion: Mapped[str] = mapped_column(Text)
    completion_ids: Mapped[list[Any] | None] = mapped_column(JSON)
    behaviour_logps: Mapped[list[Any] | None] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(20))  # the verdict's status, or "unscored" (the reward service failed)
    reward: Mapped[float | None] = mapped_column(Float)
    advantage: Mapped[float | None] = mapped_column(Float)
    model_version_id: Mapped[str | None] = mapped_column(ForeignKey("model_versions.id"))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class TrainingRun(Base):
    """One run of the alternating loop: its configuration, where it stands, what it last published."""

    __tablename__ = "training_runs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    status: Mapped[str] = mapped_column(String(20), default="queued", index=True)  # queued running succeeded failed cancelled
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    run_dir: Mapped[str] = mapped_column(String(1000))
    rounds_done: Mapped[int] = mapped_column(Integer, default=0)  # the checkpoint: rounds trained and published
    coder_version_id: Mapped[str | None] = mapped_column(ForeignKey("model_versions.id"))  # the latest it published
    proposer_version_id: Mapped[str | None] = mapped_column(
        ForeignKey("model_versions.id", name="fk_training_runs_proposer_version")
    )
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    job_id: Mapped[str | None] = mapped_column(String(36), index=True)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class TrainingRecord(Base):
    """A run's figures: one row per optimizer step and one per finished round."""

    __tablename__ = "training_records"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    run_id: Mapped[str] = mapped_column(ForeignKey("training_runs.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(10))  # step | round
    role: Mapped[str] = mapped_column(String(10), default="coder", server_default="coder")  # coder | proposer
    round: Mapped[int] = mapped_column(Integer)
    step: Mapped[int | None] = mapped_column(Integer)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class ApiCorpus(Base):
    """One mined corpus of real modules: where it came from and how much was parsed."""

    __tablename__ = "api_corpora"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    sources: Mapped[list[Any]] = mapped_column(JSON)
    files: Mapped[int] = mapped_column(Integer, default=0)
    modules: Mapped[int] = mapped_column(Integer, default=0)
    mined_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class ApiUsage(Base):
    """How many ``forward`` bodies of a corpus use one Torch API."""

    __tablename__ = "api_usage"

    corpus: Mapped[str] = mapped_column(ForeignKey("api_corpora.name", ondelete="CASCADE"), primary_key=True)
    api: Mapped[str] = mapped_column(String(200), primary_key=True)
    count: Mapped[int] = mapped_column(Integer)


class ApiPair(Base):
    """How many ``forward`` bodies use both APIs (stored once, with ``api_a < api_b``)."""

    __tablename__ = "api_pairs"

    corpus: Mapped[str] = mapped_column(ForeignKey("api_corpora.name", ondelete="CASCADE"), primary_key=True)
    api_a: Mapped[str] = mapped_column(String(200), primary_key=True)
    api_b: Mapped[str] = mapped_column(String(200), primary_key=True)
    count: Mapped[int] = mapped_column(Integer)
