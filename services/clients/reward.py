"""Client of the reward service: score one kernel or a group, waiting through the job when it runs long."""

from __future__ import annotations

from services.clients.base import JobTimeout, ServiceClient
from services.schemas.jobs import FINISHED, JobOut
from services.schemas.reward import (
    CAGRPOConfig,
    GroupResult,
    GroupScoreRequest,
    GroupScoreResponse,
    ScoreOptions,
    ScoreRequest,
    ScoreResponse,
)


class RewardClient(ServiceClient):
    service = "reward"
    # The route holds a request open at most this long (below the HTTP read timeout); the rest of
    # the wait polls the job, so a long evaluation never looks like a dead connection.
    route_wait_s: float = 20.0

    def score(self, reference: str, candidate: str, options: ScoreOptions | None = None, wait_s: float = 300.0) -> ScoreResponse:
        """One verdict; ``job_status`` is still queued/running only when ``wait_s`` ran out."""
        body = ScoreRequest(
            reference=reference, candidate=candidate, options=options or ScoreOptions(), wait_s=min(wait_s, self.route_wait_s)
        )
        response = ScoreResponse.model_validate(self.request("POST", "/v1/score", json=body.model_dump()).json())
        if response.job_status in FINISHED:
            return response
        job = self._wait(response.job_id, wait_s)
        verdict = GroupResult.model_validate(job.result).verdicts[0] if job.result else None
        return ScoreResponse(job_id=job.id, job_status=job.status, verdict=verdict, error=job.error)

    def score_group(
        self,
        reference: str,
        candidates: list[str],
        options: ScoreOptions | None = None,
        ca_grpo: CAGRPOConfig | None = None,
        wait_s: float = 300.0,
    ) -> GroupScoreResponse:
        """Verdicts with CA-GRPO rewards for a group; the job id links them to the stored scores."""
        body = GroupScoreRequest(
            reference=reference,
            candidates=candidates,
            options=options or ScoreOptions(),
            ca_grpo=ca_grpo or CAGRPOConfig(),
            wait_s=min(wait_s, self.route_wait_s),
        )
        response = GroupScoreResponse.model_validate(self.request("POST", "/v1/score/group", json=body.model_dump()).json())
        if response.job_status in FINISHED:
            return response
        job = self._wait(response.job_id, wait_s)
        result = GroupResult.model_validate(job.result) if job.result else None
        return GroupScoreResponse(job_id=job.id, job_status=job.status, result=result, error=job.error)

    def _wait(self, job_id: str, wait_s: float) -> JobOut:
        """The job after polling up to ``wait_s``: its last state, not an exception, when time ran out."""
        try:
            return self.wait_for_job(job_id, timeout_s=wait_s)
        except JobTimeout as exc:
            return exc.job
