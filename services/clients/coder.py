"""Client of the coder service: ask for a verified kernel, read a job's result, switch the serving model."""

from __future__ import annotations

from services.clients.base import AsyncServiceClient, Flow, JobTimeout, Send, ServiceClient, ask, flow_method
from services.clients.serving import ModelServingRoutes
from services.schemas.coder import KernelRequest, KernelResponse
from services.schemas.jobs import FINISHED


class CoderRoutes(ModelServingRoutes):
    """The coder service's routes, written once for ``CoderClient`` and ``AsyncCoderClient``."""

    service = "coder"

    @flow_method
    def generate(self, request: KernelRequest) -> Flow[KernelResponse]:
        """Submit; waits up to ``request.wait_s`` in all (route wait, then polling the job)."""
        body = request.model_copy(update={"wait_s": min(request.wait_s, self.route_wait_s)})
        response = yield from ask(Send("POST", "/v1/kernels", json=body.model_dump()))
        answer = KernelResponse.model_validate(response.json())
        if answer.job_status in FINISHED:
            return answer
        try:
            yield from self.wait_flow(answer.job_id, timeout_s=request.wait_s)
        except JobTimeout:
            pass  # the caller reads job_status: still queued or running
        return (yield from self.kernel_flow(answer.job_id))

    @flow_method
    def kernel(self, job_id: str) -> Flow[KernelResponse]:
        return (yield from self.kernel_flow(job_id))

    def kernel_flow(self, job_id: str) -> Flow[KernelResponse]:
        response = yield from ask(Send("GET", f"/v1/kernels/{job_id}"))
        return KernelResponse.model_validate(response.json())


class CoderClient(CoderRoutes, ServiceClient):
    """The coder service, blocking."""


class AsyncCoderClient(CoderRoutes, AsyncServiceClient):
    """The coder service, for asyncio."""
