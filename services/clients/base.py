"""The clients every service client extends: base URL, API key, timeouts, retries, errors that carry the
server's own reason, and the routes every service has (health, readiness, jobs, probe).

Each route's contract is written once, as a *flow*: a generator that yields what it needs done (``Send``
a request, ``Pause`` between polls) and returns the typed answer. ``ServiceClient`` runs flows with
blocking I/O and ``AsyncServiceClient`` with ``await``; a client class lists its flows with
``flow_method`` and gets both faces from the one definition (``RewardClient`` and ``AsyncRewardClient``
share ``RewardRoutes``).

Transient failures (no connection, 429, 5xx) are retried by tenacity with exponential backoff and
jitter, ``Retry-After`` honoured; every route retried is idempotent (the same body is the same job).
Callers get pydantic objects (``services.schemas``), the same ones the server validated, so a schema
change breaks at the boundary instead of deep inside a caller.
"""

from __future__ import annotations

import asyncio
import email.utils
import time
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, ClassVar, Concatenate, Generic, ParamSpec, Self, TypeVar, overload

import httpx
from tenacity import AsyncRetrying, RetryCallState, Retrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from services.config import Settings, get_settings
from services.schemas.jobs import FINISHED, JobOut, ProbeIn, Readiness

RETRIED_STATUSES = frozenset({429, 500, 502, 503, 504})
MAX_RETRY_AFTER_S = 120.0  # a server asking for longer is waited on this long at most, then asked again


class ServiceError(RuntimeError):
    """The service answered 4xx/5xx; ``detail`` is the reason the server gave."""

    def __init__(self, method: str, url: str, status_code: int, detail: str, retry_after_s: float | None = None) -> None:
        super().__init__(f"{method} {url} -> {status_code}: {detail}")
        self.status_code = status_code
        self.detail = detail
        self.retry_after_s = retry_after_s


class ServiceUnreachable(ConnectionError):
    """No answer at all: the service is down, the URL is wrong, or the answer did not come in time."""

    def __init__(self, message: str, *, connect_failed: bool) -> None:
        super().__init__(message)
        self.connect_failed = connect_failed  # no connection was made, so nothing reached the server


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


def retry_after_seconds(response: httpx.Response) -> float | None:
    """``Retry-After`` as seconds (it may be a number or an HTTP date), None when absent or unreadable."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def is_transient(exc: BaseException) -> bool:
    """Worth asking again: no connection was made, or the server said 429 or 5xx."""
    if isinstance(exc, ServiceUnreachable):
        return exc.connect_failed
    return isinstance(exc, ServiceError) and exc.status_code in RETRIED_STATUSES


class WaitRetryAfter:
    """tenacity's wait: the server's ``Retry-After`` when it gave one, else exponential backoff with jitter."""

    def __init__(self, initial_s: float, max_s: float) -> None:
        self.backoff = wait_exponential_jitter(initial=initial_s, max=max_s)

    def __call__(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, ServiceError) and exc.retry_after_s is not None:
            return min(exc.retry_after_s, MAX_RETRY_AFTER_S)
        return float(self.backoff(state))


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a client asks again after a transient failure (``max_retries=0``: never)."""

    max_retries: int = 4
    initial_backoff_s: float = 0.5
    max_backoff_s: float = 30.0

    def tenacity_args(self) -> dict[str, Any]:
        return {
            "retry": retry_if_exception(is_transient),
            "wait": WaitRetryAfter(self.initial_backoff_s, self.max_backoff_s),
            "stop": stop_after_attempt(self.max_retries + 1),
            "reraise": True,
        }


@dataclass(frozen=True)
class Send:
    """A flow's step: send one request; a 4xx/5xx not in ``accept`` raises ``ServiceError``."""

    method: str
    path: str
    json: Any = None
    params: dict[str, Any] | None = None
    accept: tuple[int, ...] = ()


@dataclass(frozen=True)
class Pause:
    """A flow's step: wait this long (between polls of a job)."""

    seconds: float


T = TypeVar("T")
P = ParamSpec("P")
Step = Send | Pause
Flow = Generator[Step, Any, T]  # yields steps, is sent each Send's httpx.Response, returns the answer


def ask(request: Send) -> Generator[Step, Any, httpx.Response]:
    """``response = yield from ask(Send(...))``: the response, typed."""
    response: httpx.Response = yield request
    return response


class flow_method(Generic[P, T]):
    """Turns a flow into a method: blocking on a ``ServiceClient``, a coroutine on an ``AsyncServiceClient``."""

    def __init__(self, flow: Callable[Concatenate[Any, P], Flow[T]]) -> None:
        self.flow = flow
        self.__doc__ = flow.__doc__

    @overload
    def __get__(self, client: AsyncServiceClient, owner: type | None = None) -> Callable[P, Awaitable[T]]: ...
    @overload
    def __get__(self, client: ServiceClient, owner: type | None = None) -> Callable[P, T]: ...
    @overload
    def __get__(self, client: None, owner: type | None = None) -> Self: ...
    def __get__(self, client: Any, owner: type | None = None) -> Any:
        if client is None:
            return self

        def run(*args: P.args, **kwargs: P.kwargs) -> Any:
            return client.run_flow(self.flow(client, *args, **kwargs))

        run.__doc__ = self.flow.__doc__
        return run


class ClientConfig:
    """What both faces of a client hold: the service's URL, the key, timeouts and the retry policy."""

    service: ClassVar[str]
    route_wait_s: ClassVar[float] = 20.0  # a route holds a request at most this long; longer waits poll the job

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 30.0,
        connect_timeout_s: float = 5.0,
        retry: RetryPolicy | None = None,
    ) -> None:
        settings = get_settings()
        self.base_url = (base_url or settings.service_url(self.service)).rstrip("/")
        key = api_key or resolve_api_key(settings)
        self.retry = retry or RetryPolicy()
        self._http_options: dict[str, Any] = {
            "base_url": self.base_url,
            "headers": {"Authorization": f"Bearer {key}"} if key else {},
            "timeout": httpx.Timeout(timeout_s, connect=connect_timeout_s),
        }

    def checked(self, request: Send, response: httpx.Response) -> httpx.Response:
        if response.is_error and response.status_code not in request.accept:
            raise ServiceError(
                request.method, str(response.url), response.status_code, error_detail(response), retry_after_seconds(response)
            )
        return response

    def unreachable(self, request: Send, exc: httpx.TransportError) -> ServiceUnreachable:
        connect_failed = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
        return ServiceUnreachable(
            f"{request.method} {self.base_url}{request.path}: {type(exc).__name__}: {exc}", connect_failed=connect_failed
        )

    # The routes every service has.

    @flow_method
    def health(self) -> Flow[dict[str, str]]:
        response = yield from ask(Send("GET", "/healthz"))
        data: dict[str, str] = response.json()
        return data

    @flow_method
    def readiness(self) -> Flow[Readiness]:
        """503 is an answer here (a dependency is down), not an error: read ``ready``."""
        response = yield from ask(Send("GET", "/readyz", accept=(503,)))
        return Readiness.model_validate(response.json())

    @flow_method
    def get_job(self, job_id: str) -> Flow[JobOut]:
        return (yield from self.job_flow(job_id))

    @flow_method
    def probe(self, token: str, sleep_s: float = 0.0) -> Flow[JobOut]:
        """Queue a diagnostic job on the service's own worker; the same token is the same job."""
        body = ProbeIn(token=token, sleep_s=sleep_s)
        response = yield from ask(Send("POST", "/v1/probe", json=body.model_dump()))
        return JobOut.model_validate(response.json())

    @flow_method
    def wait_for_job(self, job_id: str, timeout_s: float = 300.0, poll_s: float = 0.5) -> Flow[JobOut]:
        """Poll until the job succeeded or failed (check ``status``); ``JobTimeout`` otherwise."""
        return (yield from self.wait_flow(job_id, timeout_s, poll_s))

    def job_flow(self, job_id: str) -> Flow[JobOut]:
        response = yield from ask(Send("GET", f"/v1/jobs/{job_id}"))
        return JobOut.model_validate(response.json())

    def wait_flow(self, job_id: str, timeout_s: float, poll_s: float = 0.5) -> Flow[JobOut]:
        deadline = time.monotonic() + timeout_s
        while True:
            job = yield from self.job_flow(job_id)
            if job.status in FINISHED:
                return job
            if time.monotonic() >= deadline:
                raise JobTimeout(job, timeout_s)
            yield Pause(poll_s)

    def last_state_flow(self, job_id: str, timeout_s: float) -> Flow[JobOut]:
        """The job after polling up to ``timeout_s``: its last state, not an exception, when time ran out."""
        try:
            return (yield from self.wait_flow(job_id, timeout_s))
        except JobTimeout as exc:
            return exc.job


class ServiceClient(ClientConfig):
    """A blocking client of one KernelZero service; subclasses name the service and add its flows."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._http = httpx.Client(**self._http_options)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def run_flow(self, flow: Flow[T]) -> T:
        try:
            step = next(flow)
            while True:
                if isinstance(step, Pause):
                    time.sleep(step.seconds)
                    step = next(flow)
                    continue
                try:
                    response = self.send(step)
                except (ServiceError, ServiceUnreachable) as exc:
                    step = flow.throw(exc)  # a flow may answer a failure itself
                else:
                    step = flow.send(response)
        except StopIteration as done:
            return done.value

    def send(self, request: Send) -> httpx.Response:
        for attempt in Retrying(**self.retry.tenacity_args()):
            with attempt:
                try:
                    response = self._http.request(request.method, request.path, json=request.json, params=request.params)
                except httpx.TransportError as exc:
                    raise self.unreachable(request, exc) from exc
                return self.checked(request, response)
        raise AssertionError("unreachable: tenacity reraises the last failure")


class AsyncServiceClient(ClientConfig):
    """The same client for asyncio: every flow method is a coroutine (``await client.score_group(...)``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._http = httpx.AsyncClient(**self._http_options)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def run_flow(self, flow: Flow[T]) -> T:
        try:
            step = next(flow)
            while True:
                if isinstance(step, Pause):
                    await asyncio.sleep(step.seconds)
                    step = next(flow)
                    continue
                try:
                    response = await self.send(step)
                except (ServiceError, ServiceUnreachable) as exc:
                    step = flow.throw(exc)
                else:
                    step = flow.send(response)
        except StopIteration as done:
            return done.value

    async def send(self, request: Send) -> httpx.Response:
        async for attempt in AsyncRetrying(**self.retry.tenacity_args()):
            with attempt:
                try:
                    response = await self._http.request(request.method, request.path, json=request.json, params=request.params)
                except httpx.TransportError as exc:
                    raise self.unreachable(request, exc) from exc
                return self.checked(request, response)
        raise AssertionError("unreachable: tenacity reraises the last failure")
