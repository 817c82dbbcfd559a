"""The ``openai`` backend: any OpenAI-compatible chat endpoint, ``vllm serve`` above all.

Plain httpx, no SDK. One client is shared by all threads; a semaphore bounds the requests in
flight. Connect errors, 429 and 5xx are retried with exponential backoff and jitter (a
``Retry-After`` is honoured); any other 4xx is the caller's mistake and fails at once with the
server's message. A server that refuses ``n > 1`` (or silently returns fewer choices) gets the
rest as parallel single requests. Every ``Completion`` carries the served model's name (from the
response) and its version (``system_fingerprint``, else vLLM's ``/v1/models`` ``root``/``parent``).
"""

from __future__ import annotations

import email.utils
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import structlog

from services.llm.chat import Completion, Message, SampledTokens, Sampling

log = structlog.get_logger(__name__)

RETRYABLE_TRANSPORT_ERRORS = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
    httpx.RemoteProtocolError,
    httpx.ReadError,
    httpx.WriteError,
)


class ModelBackendError(RuntimeError):
    """A chat request that failed for good; ``status`` is the HTTP status when there was one."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class OpenAIChatModel:
    backend = "openai"

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        api_key: str | None = None,
        *,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 10.0,
        max_retries: int = 4,
        max_concurrency: int = 8,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 30.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.max_retries = max_retries
        self.max_concurrency = max_concurrency
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(
            base_url=self.base_url,
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
            limits=httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency),
        )
        self._slots = threading.BoundedSemaphore(max_concurrency)
        self._pool = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="openai-chat")
        self._versions: dict[str, str | None] = {}
        self._multi_n = True  # until the server refuses n > 1

    # --- chat ----------------------------------------------------------------------------------

    def complete(self, messages: list[Message], sampling: Sampling) -> list[Completion]:
        model = self.served_model()
        if sampling.n == 1 or not self._multi_n:
            return self._parallel_singles(model, messages, sampling, sampling.n)
        try:
            completions = self._request(model, messages, sampling, sampling.n)
        except ModelBackendError as exc:
            if exc.status not in (400, 422):
                raise
            # Some servers refuse n > 1. If single requests pass, that was the reason: remember it.
            try:
                completions = self._parallel_singles(model, messages, sampling, sampling.n)
            except ModelBackendError:
                raise exc from None
            log.info("openai_n_refused", model=model, reason=str(exc))
            self._multi_n = False
            return completions
        if len(completions) < sampling.n:  # servers that ignore n answer once
            completions += self._parallel_singles(
                model, messages, sampling, sampling.n - len(completions), seed_offset=len(completions)
            )
        return completions[: sampling.n]

    def _parallel_singles(
        self, model: str, messages: list[Message], sampling: Sampling, count: int, seed_offset: int = 0
    ) -> list[Completion]:
        # Distinct seeds keep seeded single requests from all returning the same sample.
        def one(i: int) -> list[Completion]:
            seed = None if sampling.seed is None else sampling.seed + seed_offset + i
            return self._request(model, messages, sampling, 1, seed=seed)

        if count == 1:
            return one(0)
        return [c for batch in self._pool.map(one, range(count)) for c in batch]

    def _request(
        self, model: str, messages: list[Message], sampling: Sampling, n: int, seed: int | None = None
    ) -> list[Completion]:
        body: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "n": n,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": sampling.max_tokens,
        }
        seed = sampling.seed if seed is None else seed
        if seed is not None:
            body["seed"] = seed
        if sampling.logprobs:  # vLLM: each sampled token as "token_id:<id>" with its log-probability
            body["logprobs"] = True
            body["return_tokens_as_token_ids"] = True
        data = self._post_json("/chat/completions", body)
        served = data.get("model") or model
        try:
            version = data.get("system_fingerprint") or self.model_version(served)
        except ModelBackendError:  # the completions are good; an endpoint without /models costs only the version
            version = None
        return [
            Completion(
                text=(choice.get("message") or {}).get("content") or "",
                model=served,
                model_version=version,
                finish_reason=choice.get("finish_reason"),
                tokens=_sampled_tokens(choice) if sampling.logprobs else None,
            )
            for choice in sorted(data.get("choices", []), key=lambda c: c.get("index", 0))
        ]

    # --- served model and version ----------------------------------------------------------------

    def list_models(self) -> list[dict[str, Any]]:
        return list(self._send("GET", "/models").json().get("data", []))

    def served_model(self) -> str:
        """The model name requests use: the configured one, else the first the server lists."""
        if self.model is None:
            models = self.list_models()
            if not models:
                raise ModelBackendError(f"{self.base_url}/models lists no model")
            self.model = str(models[0]["id"])
        return self.model

    def model_version(self, name: str) -> str | None:
        """A version string for ``name`` from ``/v1/models``: an explicit ``version``, else vLLM's
        ``root`` (the weights path), with ``parent`` for a LoRA adapter (``base+adapter@path``)."""
        if name not in self._versions:
            entry = next((m for m in self.list_models() if m.get("id") == name), None)
            self._versions[name] = _version_of(entry) if entry else None
        return self._versions[name]

    def use_model(self, name: str) -> None:
        """Send later requests to ``name`` (a served model or a loaded LoRA adapter)."""
        self.model = name
        self._versions.clear()

    def load_adapter(self, name: str, path: str) -> None:
        """vLLM runtime LoRA loading (the server needs ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``).

        Every worker process applies the serving version when it starts, so the shared server may
        already hold the adapter: vLLM's 400 "already been loaded" is success here."""
        try:
            self._post("/load_lora_adapter", {"lora_name": name, "lora_path": path})
        except ModelBackendError as exc:
            if exc.status != 400 or "already" not in str(exc).lower():
                raise
        self._versions.clear()

    def unload_adapter(self, name: str) -> None:
        self._post("/unload_lora_adapter", {"lora_name": name})
        self._versions.clear()

    def describe(self) -> dict[str, Any]:
        model = self.served_model()
        return {
            "backend": self.backend,
            "base_url": self.base_url,
            "model": model,
            "model_version": self.model_version(model),
            "max_concurrency": self.max_concurrency,
        }

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._client.close()

    # --- HTTP with retries -----------------------------------------------------------------------

    def _post_json(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = self._post(path, body)
        try:
            return dict(response.json())
        except ValueError as exc:
            raise ModelBackendError(f"{self.base_url}{path} answered non-JSON: {response.text[:200]!r}") from exc

    def _post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        return self._send("POST", path, json=body)

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        url = f"{self.base_url}{path}"
        for attempt in range(self.max_retries + 1):
            retry_after: float | None = None
            try:
                with self._slots:
                    response = self._client.request(method, path, **kwargs)
            except RETRYABLE_TRANSPORT_ERRORS as exc:
                problem, status = f"{type(exc).__name__}: {exc}", None
            except httpx.TimeoutException as exc:
                # A read timeout means the server is generating past our limit; repeating it only doubles the cost.
                raise ModelBackendError(f"{method} {url} timed out: {type(exc).__name__}") from exc
            except httpx.HTTPError as exc:  # any other transport failure: ours to report, not httpx's
                raise ModelBackendError(f"{method} {url} failed: {type(exc).__name__}: {exc}") from exc
            else:
                if response.is_success:
                    return response
                status = response.status_code
                problem = f"HTTP {status}: {_error_message(response)}"
                if status != 429 and status < 500:
                    raise ModelBackendError(f"{method} {url} was refused, {problem}", status=status)
                retry_after = _retry_after_s(response)
            if attempt == self.max_retries:
                raise ModelBackendError(f"{method} {url} failed after {attempt + 1} attempts; last: {problem}", status=status)
            delay = self._backoff_s(attempt, retry_after)
            log.warning("openai_retry", url=url, attempt=attempt + 1, problem=problem, delay_s=round(delay, 3))
            time.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    def _backoff_s(self, attempt: int, retry_after: float | None) -> float:
        """Full-jitter exponential backoff; never sooner than the server's ``Retry-After``."""
        delay = random.uniform(0.5, 1.0) * min(self.backoff_max_s, self.backoff_base_s * 2**attempt)
        return max(delay, min(retry_after, 10 * self.backoff_max_s)) if retry_after is not None else delay


def _version_of(entry: dict[str, Any]) -> str | None:
    if entry.get("version"):
        return str(entry["version"])
    root, parent = entry.get("root"), entry.get("parent")
    if parent:
        return f"{parent}+{entry.get('id')}@{root}" if root else f"{parent}+{entry.get('id')}"
    return str(root) if root else None


def _error_message(response: httpx.Response) -> str:
    try:
        data = response.json()
    except ValueError:
        return response.text[:500]
    error = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(error, dict):
        return str(error.get("message") or error.get("detail") or error)[:500]
    return str(error)[:500]


def _retry_after_s(response: httpx.Response) -> float | None:
    value = response.headers.get("Retry-After")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def _sampled_tokens(choice: dict[str, Any]) -> SampledTokens | None:
    """A choice's token ids and log-probabilities from vLLM's ``logprobs.content`` (tokens spelled
    ``token_id:<id>``); None where the server gave no ids (a server that ignores the request: the
    trainer then re-tokenises the text and uses no sampler log-probabilities)."""
    entries = (choice.get("logprobs") or {}).get("content") or []
    ids, logprobs = [], []
    for entry in entries:
        token = str(entry.get("token", ""))
        if not token.startswith("token_id:") or not token[9:].lstrip("-").isdigit():
            return None
        ids.append(int(token[9:]))
        logprobs.append(float(entry.get("logprob", 0.0)))
    return SampledTokens(completion_ids=ids, logprobs=logprobs) if ids else None
