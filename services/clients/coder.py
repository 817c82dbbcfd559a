"""Client of the coder service: ask for a verified kernel, read a job's result, switch the serving model."""

from __future__ import annotations

from services.clients.base import JobTimeout
from services.clients.serving import ModelServingClient
from services.schemas.coder import KernelRequest, KernelResponse
from services.schemas.jobs import FINISHED


class CoderClient(ModelServingClient):
    service = "coder"
    route_wait_s: float = 20.0  # as in the reward client: hold the connection briefly, then poll

    def generate(self, request: KernelRequest) -> KernelResponse:
        """Submit; waits up to ``request.wait_s`` in all (route wait, then polling the job)."""
        body = request.model_copy(update={"wait_s": min(request.wait_s, self.route_wait_s)})
        response = KernelResponse.model_validate(self.request("POST", "/v1/kernels", json=body.model_dump()).json())
        if response.job_status in FINISHED:
            return response
        try:
            self.wait_for_job(response.job_id, timeout_s=request.wait_s)
        except JobTimeout:
            pass  # the caller reads job_status: still queued or running
        return self.kernel(response.job_id)

    def kernel(self, job_id: str) -> KernelResponse:
        return KernelResponse.model_validate(self.request("GET", f"/v1/kernels/{job_id}").json())
