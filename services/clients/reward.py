"""Client of the reward service: score one kernel or a group, waiting through the job when it runs long;
OpenRLHF's remote reward protocol (``/get_reward``)."""

from __future__ import annotations

from services.clients.base import AsyncServiceClient, ClientConfig, Flow, Send, ServiceClient, ask, flow_method
from services.schemas.jobs import FINISHED
from services.schemas.reward import (
    CAGRPOConfig,
    GroupResult,
    GroupScoreRequest,
    GroupScoreResponse,
    RemoteRewardRequest,
    RemoteRewardResponse,
    ScoreOptions,
    ScoreRequest,
    ScoreResponse,
)


class RewardRoutes(ClientConfig):
    """The reward service's routes, written once for ``RewardClient`` and ``AsyncRewardClient``."""

    service = "reward"

    @flow_method
    def score(
        self, reference: str, candidate: str, options: ScoreOptions | None = None, wait_s: float = 300.0
    ) -> Flow[ScoreResponse]:
        """One verdict; ``job_status`` is still queued/running only when ``wait_s`` ran out."""
        body = ScoreRequest(
            reference=reference, candidate=candidate, options=options or ScoreOptions(), wait_s=min(wait_s, self.route_wait_s)
        )
        response = yield from ask(Send("POST", "/v1/score", json=body.model_dump()))
        answer = ScoreResponse.model_validate(response.json())
        if answer.job_status in FINISHED:
            return answer
        job = yield from self.last_state_flow(answer.job_id, wait_s)
        verdict = GroupResult.model_validate(job.result).verdicts[0] if job.result else None
        return ScoreResponse(job_id=job.id, job_status=job.status, verdict=verdict, error=job.error)

    @flow_method
    def score_group(
        self,
        reference: str,
        candidates: list[str],
        options: ScoreOptions | None = None,
        ca_grpo: CAGRPOConfig | None = None,
        wait_s: float = 300.0,
    ) -> Flow[GroupScoreResponse]:
        """Verdicts with CA-GRPO rewards for a group; the job id links them to the stored scores."""
        body = GroupScoreRequest(
            reference=reference,
            candidates=candidates,
            options=options or ScoreOptions(),
            ca_grpo=ca_grpo or CAGRPOConfig(),
            wait_s=min(wait_s, self.route_wait_s),
        )
        response = yield from ask(Send("POST", "/v1/score/group", json=body.model_dump()))
        answer = GroupScoreResponse.model_validate(response.json())
        if answer.job_status in FINISHED:
            return answer
        job = yield from self.last_state_flow(answer.job_id, wait_s)
        result = GroupResult.model_validate(job.result) if job.result else None
        return GroupScoreResponse(job_id=job.id, job_status=job.status, result=result, error=job.error)

    @flow_method
    def get_reward(
        self, request: RemoteRewardRequest, backend: str = "triton", device: str = "auto", wait_s: float = 170.0
    ) -> Flow[RemoteRewardResponse]:
        """OpenRLHF's remote reward protocol, as OpenRLHF's rollout workers call it (here with the client's key)."""
        params = {"backend": backend, "device": device, "wait_s": wait_s}
        response = yield from ask(Send("POST", "/v1/get_reward", json=request.model_dump(), params=params))
        return RemoteRewardResponse.model_validate(response.json())


class RewardClient(RewardRoutes, ServiceClient):
    """The reward service, blocking."""


class AsyncRewardClient(RewardRoutes, AsyncServiceClient):
    """The reward service, for asyncio (TRL's async reward functions, verl's async reward loop)."""
