"""Client of the proposer service: propose a round of tasks, read the pool and the frontier, switch the
model its llm composer serves."""

from __future__ import annotations

from services.clients.base import AsyncServiceClient, Flow, Send, ServiceClient, ask, flow_method
from services.clients.serving import ModelServingRoutes
from services.schemas.jobs import FINISHED
from services.schemas.proposer import FrontierOut, ProposeRequest, ProposeResponse, ProposeSummary, TaskOut, TaskPage


class ProposerRoutes(ModelServingRoutes):
    """The proposer service's routes, written once for ``ProposerClient`` and ``AsyncProposerClient``."""

    service = "proposer"

    @flow_method
    def propose(self, request: ProposeRequest, wait_s: float = 600.0) -> Flow[ProposeResponse]:
        """Run a round; ``job_status`` is still queued/running only when ``wait_s`` ran out."""
        body = request.model_copy(update={"wait_s": min(wait_s, self.route_wait_s)})
        response = yield from ask(Send("POST", "/v1/tasks/propose", json=body.model_dump()))
        answer = ProposeResponse.model_validate(response.json())
        if answer.job_status in FINISHED or wait_s <= self.route_wait_s:
            return answer
        job = yield from self.last_state_flow(answer.job_id, wait_s)
        result = ProposeSummary.model_validate(job.result) if job.result else None
        return ProposeResponse(job_id=job.id, job_status=job.status, result=result, error=job.error)

    @flow_method
    def tasks(self, status: str | None = None, origin: str | None = None, limit: int = 50, offset: int = 0) -> Flow[TaskPage]:
        params = {
            k: v for k, v in {"status": status, "origin": origin, "limit": limit, "offset": offset}.items() if v is not None
        }
        response = yield from ask(Send("GET", "/v1/tasks", params=params))
        return TaskPage.model_validate(response.json())

    @flow_method
    def task(self, task_id: str) -> Flow[TaskOut]:
        response = yield from ask(Send("GET", f"/v1/tasks/{task_id}"))
        return TaskOut.model_validate(response.json())

    @flow_method
    def frontier(self, count: int = 20, bins: int = 10) -> Flow[FrontierOut]:
        response = yield from ask(Send("GET", "/v1/frontier", params={"count": count, "bins": bins}))
        return FrontierOut.model_validate(response.json())


class ProposerClient(ProposerRoutes, ServiceClient):
    """The proposer service, blocking."""


class AsyncProposerClient(ProposerRoutes, AsyncServiceClient):
    """The proposer service, for asyncio."""
