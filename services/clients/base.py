"""The client every service client extends: base URL, API key, timeouts, errors that carry the
server's own reason, and the routes every service has (health, readiness, jobs, probe).

Callers get pydantic objects (``services.schemas``), the same ones the server validated, so a
schema change breaks at the boundary instead of deep inside a caller.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar, Self

import httpx

from services.config import Settings, get_settings
from services.schemas.jobs import FINISHED, JobOut, ProbeIn, Readiness


class ServiceError(RuntimeError):
    """The service answered 4xx/5xx; ``detail`` is the reason the server gave."""

    def __init__(self, method: str, url: str, status_code: int, detail: str) -> None:
        super().__init__(f"{method} {url} -> {status_code}: {detail}")
        self.status_code = status_code
        self.detail = detail


class ServiceUnreachable(ConnectionError):
    """No answer at all: the service is down or the URL is wrong."""


class JobTimeout(TimeoutError):
    """The job did not reach a final state in time; ``job`` is its last observed state."""

    def __init__(self, job: JobOut, timeout_s: float) -> None:
        super().__init__(f"job {job.id} still {job.status} after {timeout_s:.0f} s")
        self.job = job


def resolve_api_key(settings: Settings) -> str | None:
    """``KZ_API_KEY`` wins; otherwise the key ``kernelzero up`` left for this machine, if any."""
    if settings.api_key is not None:
        return settings.api_key.get_secret_value()
    if settings.api_key_file.is_file():
        return settings.api_key_file.read_text().strip() or None
    return None


def error_detail(response: httpx.Response) -> str:
    """FastAPI's ``detail`` (a string, or a list of validation errors), else the raw body."""
    try:
        detail: Any = response.json().get("detail")
    except (ValueError, AttributeError):
        return response.text[:500] or response.reason_phrase
    if isinstance(detail, list):
        return "; ".join(f"{'.'.join(str(p) for p in e.get('loc', []))}: {e.get('msg')}" for e in detail)
    return str(detail) if detail is not None else response.text[:500]


class ServiceClient:
    """A synchronous client of one KernelZero service; subclasses name the service."""

    service: ClassVar[str]

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 30.0,
        connect_timeout_s: float = 5.0,
    ) -> None:
        settings = get_settings()
        self.base_url = (base_url or settings.service_url(self.service)).rstrip("/")
        key = api_key or resolve_api_key(settings)
        self._http = httpx.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {key}"} if key else {},
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
        )

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def request(self, method: str, path: str, *, json: Any = None, accept: tuple[int, ...] = ()) -> httpx.Response:
        """Send a request; a 4xx/5xx not listed in ``accept`` raises ``ServiceError``."""
        try:
            response = self._http.request(method, path, json=json)
        except httpx.TransportError as exc:
            raise ServiceUnreachable(f"{method} {self.base_url}{path}: {type(exc).__name__}: {exc}") from exc
        if response.is_error and response.status_code not in accept:
            raise ServiceError(method, str(response.url), response.status_code, error_detail(response))
        return response

    def health(self) -> dict[str, str]:
        return self.request("GET", "/healthz").json()

    def readiness(self) -> Readiness:
        """503 is an answer here (a dependency is down), not an error: read ``ready``."""
        return Readiness.model_validate(self.request("GET", "/readyz", accept=(503,)).json())

    def get_job(self, job_id: str) -> JobOut:
        return JobOut.model_validate(self.request("GET", f"/v1/jobs/{job_id}").json())

    def probe(self, token: str, sleep_s: float = 0.0) -> JobOut:
        """Queue a diagnostic job on the service's own worker; the same token is the same job."""
        body = ProbeIn(token=token, sleep_s=sleep_s)
        return JobOut.model_validate(self.request("POST", "/v1/probe", json=body.model_dump()).json())

    def wait_for_job(self, job_id: str, timeout_s: float = 300.0, poll_s: float = 0.5) -> JobOut:
        """Poll until the job succeeded or failed (check ``status``); ``JobTimeout`` otherwise."""
        deadline = time.monotonic() + timeout_s
        while True:
            job = self.get_job(job_id)
            if job.status in FINISHED:
                return job
            if time.monotonic() >= deadline:
                raise JobTimeout(job, timeout_s)
            time.sleep(poll_s)
