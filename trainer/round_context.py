"""What a round of the loop runs with, shared by its two halves: the services' clients, progress,
cancellation and the reasons a round stops, giving back what an attempt claimed, waiting for a job."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from sqlalchemy import update

from services.clients import CoderClient, ProposerClient
from services.clients.base import JobTimeout
from services.db.models import RolloutGroup
from services.db.session import session_scope
from services.schemas.coder import KernelResult


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


def claim_key(run_id: str, round_index: int) -> str:
    return f"{run_id}/r{round_index}"


def release_claims(key: str) -> int:
    """Give back what an attempt of a round claimed that died before it published."""
    with session_scope() as session:
        released = session.execute(
            update(RolloutGroup).where(RolloutGroup.claimed_by == key).values(claimed_by=None, claimed_at=None, dropped=None)
        )
        return int(released.rowcount)  # type: ignore[attr-defined]  # an UPDATE's result is a CursorResult


def await_kernel(coder: CoderClient, job_id: str, timeout_s: float) -> KernelResult:
    try:
        job = coder.wait_for_job(job_id, timeout_s=timeout_s, poll_s=1.0)
    except JobTimeout as exc:
        raise LoopError(f"generation job {job_id} did not finish in {timeout_s:.0f} s") from exc
    response = coder.kernel(job.id)
    if response.result is None:
        raise LoopError(f"generation job {job_id} {response.job_status}: {response.error or 'no result'}")
    return response.result
