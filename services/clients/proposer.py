"""Client of the proposer service: propose a round of tasks, read the pool and the frontier, switch the
model its llm composer serves."""

from __future__ import annotations

from urllib.parse import urlencode

from services.clients.serving import ModelServingClient
from services.schemas.jobs import FINISHED
from services.schemas.proposer import FrontierOut, ProposeRequest, ProposeResponse, ProposeSummary, TaskOut, TaskPage

ROUTE_WAIT_S = 20.0  # the route holds a request at most this long; longer waits poll the job


class ProposerClient(ModelServingClient):
    service = "proposer"

    def propose(self, request: ProposeRequest, wait_s: float = 600.0) -> ProposeResponse:
        """Run a round; ``job_status`` is still queued/running only when ``wait_s`` ran out."""
        body = request.model_copy(update={"wait_s": min(wait_s, ROUTE_WAIT_S)})
        response = ProposeResponse.model_validate(self.request("POST", "/v1/tasks/propose", json=body.model_dump()).json())
        if response.job_status in FINISHED or wait_s <= ROUTE_WAIT_S:
            return response
        try:
            job = self.wait_for_job(response.job_id, wait_s)
        except TimeoutError:
            return response
        result = ProposeSummary.model_validate(job.result) if job.result else None
        return ProposeResponse(job_id=job.id, job_status=job.status, result=result, error=job.error)

    def tasks(self, status: str | None = None, origin: str | None = None, limit: int = 50, offset: int = 0) -> TaskPage:
        params = {
            k: v for k, v in {"status": status, "origin": origin, "limit": limit, "offset": offset}.items() if v is not None
        }
        return TaskPage.model_validate(self.request("GET", f"/v1/tasks?{urlencode(params)}").json())

    def task(self, task_id: str) -> TaskOut:
        return TaskOut.model_validate(self.request("GET", f"/v1/tasks/{task_id}").json())

    def frontier(self, count: int = 20, bins: int = 10) -> FrontierOut:
        return FrontierOut.model_validate(self.request("GET", f"/v1/frontier?count={count}&bins={bins}").json())
