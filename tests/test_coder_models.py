"""The Coder's model backends on real parts: a tiny Llama built here (random weights, a tokenizer
trained offline), served by the ``hf`` backend in-process and by our OpenAI-compatible server over
HTTP for the ``openai`` backend; retries and concurrency against small real HTTP servers that
misbehave on purpose."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from coder_svc.generators import LLMKernelGenerator, build_generator, switch_model
from servers import serving
from services.config import Settings
from services.llm.chat import Sampling
from services.llm.factory import build_chat_model
from services.llm.hf_local import HFChatModel
from services.llm.openai_chat import ModelBackendError, OpenAIChatModel
from services.llm.openai_server import create_openai_app
from tiny_lm import build_lora
from trainer.tiny_model import build_tiny_lm

MESSAGES = [{"role": "system", "content": "You write kernels."}, {"role": "user", "content": "Write a relu kernel."}]
GREEDY = Sampling(n=1, temperature=0.0, max_tokens=12)
RELU_MODULE = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(16, 16)]


def get_init_inputs():
    return []
"""
PROGRAM_REPLY = """Let me fuse it.

```python
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        relu_kernel[(triton.cdiv(x.numel(), 256),)](x, out, x.numel(), BLOCK=256)
        return out
```
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny-lm")
    model = build_tiny_lm(root / "tiny")
    return {
        "model": model,
        "lora_a": build_lora(model, root / "lora-a", seed=1),
        "lora_b": build_lora(model, root / "lora-b", seed=2),
    }


@pytest.fixture(scope="module")
def hf(tiny: dict[str, Path]) -> HFChatModel:
    return HFChatModel(tiny["model"])


@pytest.fixture(scope="module")
def served(tiny: dict[str, Path]) -> Iterator[tuple[str, HFChatModel]]:
    """Our OpenAI-compatible server with its own copy of the tiny model (adapters loaded over HTTP stay there)."""
    model = HFChatModel(tiny["model"])
    with serving(create_openai_app(model)) as url:
        yield url, model


# --- hf backend ----------------------------------------------------------------------------------


def test_hf_samples_differ_and_a_seed_repeats_them(hf: HFChatModel) -> None:
    sampling = Sampling(n=4, temperature=1.0, top_p=1.0, max_tokens=12, seed=7)
    first = hf.complete(MESSAGES, sampling)
    assert len(first) == 4 and len({c.text for c in first}) == 4
    assert hf.complete(MESSAGES, sampling) == first
    assert [c.text for c in hf.complete(MESSAGES, Sampling(n=4, temperature=1.0, max_tokens=12, seed=8))] != [
        c.text for c in first
    ]
    assert {c.model for c in first} == {"tiny"}
    assert first[0].model_version == hf.base_version and hf.base_version.startswith("tiny@")
    assert {c.finish_reason for c in first} <= {"stop", "length"}


def test_hf_applies_the_chat_template(tiny: dict[str, Path]) -> None:
    model = HFChatModel(tiny["model"])
    rendered = model.render(MESSAGES)
    assert rendered == "<|system|>\nYou write kernels.<|end|>\n<|user|>\nWrite a relu kernel.<|end|>\n<|assistant|>\n"
    [(_, usage)] = model.sample([MESSAGES], GREEDY)
    assert usage.prompt_tokens == len(model.tokenizer(rendered, add_special_tokens=False)["input_ids"])
    model.tokenizer.chat_template = None
    assert model.render(MESSAGES) == "system: You write kernels.\nuser: Write a relu kernel.\nassistant:"
    assert model.complete(MESSAGES, GREEDY) != HFChatModel(tiny["model"]).complete(MESSAGES, GREEDY)


def test_hf_batches_conversations_and_samples_like_single_calls(tiny: dict[str, Path], hf: HFChatModel) -> None:
    other = [{"role": "user", "content": "import torch"}]
    batched = HFChatModel(tiny["model"], batch_size=3)  # 2 conversations x n=2: chunks of 3 rows and 1
    results = batched.sample([MESSAGES, other], Sampling(n=2, temperature=0.0, max_tokens=10))
    assert [len(completions) for completions, _ in results] == [2, 2]
    for conversation, (completions, usage) in zip([MESSAGES, other], results):
        alone = hf.complete(conversation, Sampling(n=1, temperature=0.0, max_tokens=10))[0].text
        assert [c.text for c in completions] == [alone, alone]  # left padding changes nothing
        assert 0 < usage.completion_tokens <= 2 * 10


def test_hf_lora_adapters_load_switch_and_unload_without_reloading_the_base(tiny: dict[str, Path]) -> None:
    model = HFChatModel(tiny["model"])
    base_weights = model.model.model.embed_tokens.weight
    base = model.complete(MESSAGES, GREEDY)[0]
    model.load_adapter("alpha", tiny["lora_a"])
    with_a = model.complete(MESSAGES, GREEDY)[0]
    model.load_adapter("beta", tiny["lora_b"])
    with_b = model.complete(MESSAGES, GREEDY)[0]
    assert len({base.text, with_a.text, with_b.text}) == 3
    assert (with_a.model, with_b.model) == ("alpha", "beta")
    assert with_a.model_version.startswith(f"{model.base_version}+alpha@") and with_a.model_version != with_b.model_version
    model.use_model("alpha")
    assert model.complete(MESSAGES, GREEDY)[0] == with_a
    model.use_model("tiny")
    assert model.complete(MESSAGES, GREEDY)[0] == base
    model.unload_adapter("alpha")
    assert model.describe()["adapters"] == ["beta"]
    with pytest.raises(KeyError):
        model.use_model("alpha")
    model.unload_adapter("beta")
    assert model.complete(MESSAGES, GREEDY)[0] == base and model.describe()["adapter"] is None
    assert model.model.model.embed_tokens.weight is base_weights  # the base stayed in memory throughout

    at_start = HFChatModel(tiny["model"], tiny["lora_a"])  # KZ_CODER_LORA_PATH: loaded at start under its dir name
    assert at_start.complete(MESSAGES, GREEDY)[0].text == with_a.text and at_start.served_name == "lora-a"


# --- openai backend against our OpenAI-compatible server ----------------------------------------


def test_openai_backend_against_the_local_server(served: tuple[str, HFChatModel], hf: HFChatModel) -> None:
    url, _ = served
    client = OpenAIChatModel(url)
    sampling = Sampling(n=3, temperature=1.0, top_p=0.9, max_tokens=12, seed=5)
    completions = client.complete(MESSAGES, sampling)
    assert client.served_model() == "tiny"  # the first model /v1/models lists
    assert len(completions) == 3
    assert {c.model for c in completions} == {"tiny"} and {c.model_version for c in completions} == {hf.base_version}
    assert [c.text for c in completions] == [c.text for c in hf.complete(MESSAGES, sampling)]  # same weights, same seed
    assert client.describe()["model_version"] == hf.base_version
    client.close()


def test_openai_backend_switches_lora_adapters_like_vllm(served: tuple[str, HFChatModel], tiny: dict[str, Path]) -> None:
    url, _ = served
    client = OpenAIChatModel(url, "tiny", max_retries=2, backoff_base_s=0.01)
    base = client.complete(MESSAGES, GREEDY)[0]
    client.load_adapter("coder-a", str(tiny["lora_a"]))
    listed = {m["id"]: m for m in client.list_models()}
    assert listed["coder-a"]["parent"] == "tiny" and listed["coder-a"]["root"] == str(tiny["lora_a"])
    client.use_model("coder-a")
    adapted = client.complete(MESSAGES, GREEDY)[0]
    assert adapted.model == "coder-a" and "+coder-a@" in (adapted.model_version or "")
    assert adapted.text != base.text
    client.use_model("tiny")
    assert client.complete(MESSAGES, GREEDY)[0] == base  # the base still answers by its name
    client.unload_adapter("coder-a")
    client.use_model("coder-a")
    started = time.monotonic()
    with pytest.raises(ModelBackendError) as refused:
        client.complete(MESSAGES, GREEDY)
    assert refused.value.status == 404 and "does not exist" in str(refused.value)
    assert time.monotonic() - started < 1.0  # a 4xx is not retried
    client.close()


def test_a_worker_keeps_the_latest_adapters_and_unloads_older_ones(
    served: tuple[str, HFChatModel], tiny: dict[str, Path]
) -> None:
    """Versions published one after another: two workers sharing one server each keep the served
    adapter and the one before it; the second to unload an old one finds it gone and carries on."""
    url, _ = served
    workers = [LLMKernelGenerator(OpenAIChatModel(url, "tiny")) for _ in range(2)]
    versions = {"coder-v1": tiny["lora_a"], "coder-v2": tiny["lora_b"], "coder-v3": tiny["lora_a"]}
    for name, path in versions.items():
        for worker in workers:
            switch_model(worker, name, str(path), keep=2)
    listed = {m["id"] for m in workers[0].chat_model.list_models()}  # type: ignore[attr-defined]
    assert {"coder-v2", "coder-v3"} <= listed and "coder-v1" not in listed
    assert all(w.loaded_adapters == ["coder-v2", "coder-v3"] for w in workers)
    assert workers[1].generate(RELU_MODULE, "triton", Sampling(n=1, max_tokens=4, seed=0))[0].model == "coder-v3"

    local = LLMKernelGenerator(HFChatModel(tiny["model"]))
    for name, path in versions.items():
        switch_model(local, name, str(path), keep=1)
    assert local.chat_model.describe()["adapters"] == ["coder-v3"]


def test_llm_generator_over_http_records_model_prompt_and_declines(served: tuple[str, HFChatModel]) -> None:
    url, _ = served
    generator = LLMKernelGenerator(OpenAIChatModel(url), Settings(coder_system_prompt_triton="Be brief."))
    drafts = generator.generate(RELU_MODULE, "triton", Sampling(n=2, temperature=1.0, max_tokens=8, seed=1))
    assert len(drafts) == 2
    for draft in drafts:  # random weights write no program
        assert draft.source is None and draft.declined
        assert ("max_tokens" in draft.declined) == (draft.details["finish_reason"] == "length")
        assert draft.model == "tiny" and draft.model_version
        prompt = draft.details["prompt"]
        assert prompt[0] == {"role": "system", "content": "Be brief."} and RELU_MODULE.rstrip() in prompt[1]["content"]
    assert generator.describe()["model"] == "tiny"


@pytest.mark.slow
def test_coder_serve_command(tiny: dict[str, Path], free_port: Callable[[], int]) -> None:
    """``kernelzero coder serve`` in its own process: the model list and a chat completion with usage."""
    port = free_port()
    command = [
        str(Path(sys.executable).parent / "kernelzero"),
        "coder",
        "serve",
        "--model",
        str(tiny["model"]),
        "--lora",
        str(tiny["lora_a"]),
        "--port",
        str(port),
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, process.stderr.read().decode()[-2000:] if process.stderr else ""
            try:
                models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).json()["data"]
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "kernelzero coder serve did not come up"
                time.sleep(0.25)
        assert [m["id"] for m in models] == ["tiny", "lora-a"] and models[1]["parent"] == "tiny"
        answer = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            timeout=60,
            json={"model": "lora-a", "messages": MESSAGES, "n": 2, "max_tokens": 5, "temperature": 0.0},
        ).json()
        assert answer["model"] == "lora-a" and len(answer["choices"]) == 2
        assert answer["choices"][0]["message"]["content"] == answer["choices"][1]["message"]["content"]  # greedy
        usage = answer["usage"]
        assert usage["prompt_tokens"] > 0 and 0 < usage["completion_tokens"] <= 10
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    finally:
        process.terminate()
        process.wait(30)


# --- retries, fallbacks and concurrency against misbehaving real servers ------------------------


class Script:
    """A chat server whose answers a test scripts: statuses to return first, then completions."""

    def __init__(
        self,
        statuses: list[int] | None = None,
        reply: str = "ok",
        refuse_n: bool = False,
        ignore_n: bool = False,
        delay_s: float = 0.0,
        retry_after: str | None = None,
    ) -> None:
        self.statuses = list(statuses or [])
        self.reply, self.refuse_n, self.ignore_n, self.delay_s, self.retry_after = reply, refuse_n, ignore_n, delay_s, retry_after
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.in_flight = self.max_in_flight = 0

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            return {
                "object": "list",
                "data": [{"id": "scripted", "object": "model", "root": "/models/scripted-7b", "parent": None}],
            }

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> JSONResponse:
            body = await request.json()
            self.requests.append(body)
            self.headers.append(dict(request.headers))
            if self.statuses:
                status = self.statuses.pop(0)
                headers = {"Retry-After": self.retry_after} if self.retry_after else {}
                return JSONResponse({"error": {"message": f"scripted {status}"}}, status_code=status, headers=headers)
            if self.refuse_n and body.get("n", 1) > 1:
                return JSONResponse({"error": {"message": "n > 1 is not supported"}}, status_code=400)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            await asyncio.sleep(self.delay_s)
            self.in_flight -= 1
            n = 1 if self.ignore_n else body.get("n", 1)
            return JSONResponse(
                {
                    "id": "x",
                    "object": "chat.completion",
                    "created": 0,
                    "model": "scripted",
                    "choices": [
                        {
                            "index": i,
                            "message": {"role": "assistant", "content": f"{self.reply} seed={body.get('seed')}"},
                            "finish_reason": "stop",
                        }
                        for i in range(n)
                    ],
                }
            )

        @app.post("/v1/load_lora_adapter")
        async def load_lora_adapter(request: Request) -> JSONResponse:
            name = (await request.json())["lora_name"]
            if name == "held":  # what vLLM answers when another worker loaded it first
                return JSONResponse(
                    {"error": {"message": f"The lora adapter '{name}' has already been loaded."}}, status_code=400
                )
            return JSONResponse({"error": {"message": f"No adapter found at the path for '{name}'."}}, status_code=400)

        return app


def test_an_adapter_another_worker_loaded_is_not_an_error() -> None:
    with serving(Script().app()) as url:
        client = OpenAIChatModel(url, "scripted", max_retries=0)
        client.load_adapter("held", "/adapters/held")
        with pytest.raises(ModelBackendError, match="No adapter found"):
            client.load_adapter("missing", "/adapters/missing")


def test_503_twice_then_success_after_backoff() -> None:
    script = Script(statuses=[503, 503])
    with serving(script.app()) as url:
        client = OpenAIChatModel(url, "scripted", max_retries=3, backoff_base_s=0.1)
        started = time.monotonic()
        [completion] = client.complete(MESSAGES, Sampling(n=1, seed=3))
        elapsed = time.monotonic() - started
    assert completion.text == "ok seed=3" and completion.model == "scripted"
    assert completion.model_version == "/models/scripted-7b"  # vLLM's root from /v1/models
    assert len(script.requests) == 3
    assert elapsed >= 0.05 + 0.1  # jittered backoff: at least half of 0.1 s, then of 0.2 s


def test_retry_after_is_honoured() -> None:
    script = Script(statuses=[429], retry_after="1")
    with serving(script.app()) as url:
        client = OpenAIChatModel(url, "scripted", max_retries=2, backoff_base_s=0.01)
        started = time.monotonic()
        client.complete(MESSAGES, Sampling())
        assert time.monotonic() - started >= 1.0
    assert len(script.requests) == 2


def test_400_fails_at_once_with_the_server_message() -> None:
    script = Script(statuses=[400, 400, 400])
    with serving(script.app()) as url:
        client = OpenAIChatModel(url, "scripted", max_retries=5, backoff_base_s=0.5)
        with pytest.raises(ModelBackendError) as error:
            client.complete(MESSAGES, Sampling())
    assert error.value.status == 400 and "scripted 400" in str(error.value)
    assert len(script.requests) == 1


def test_unreachable_server_fails_after_the_retries(free_port: Callable[[], int]) -> None:
    client = OpenAIChatModel(
        f"http://127.0.0.1:{free_port()}/v1", "scripted", max_retries=2, backoff_base_s=0.01, connect_timeout_s=1
    )
    with pytest.raises(ModelBackendError) as error:
        client.complete(MESSAGES, Sampling())
    assert error.value.status is None and "after 3 attempts" in str(error.value) and "ConnectError" in str(error.value)


def test_refused_n_falls_back_to_bounded_parallel_single_requests() -> None:
    script = Script(refuse_n=True, delay_s=0.2)
    with serving(script.app()) as url:
        client = OpenAIChatModel(url, "scripted", max_concurrency=2)
        completions = client.complete(MESSAGES, Sampling(n=6, seed=10))
        assert sorted(c.text for c in completions) == sorted(f"ok seed={10 + i}" for i in range(6))  # distinct seeds
        assert script.max_in_flight == 2  # parallel, and never more than the bound
        asked_for_n = sum(1 for r in script.requests if r["n"] > 1)
        client.complete(MESSAGES, Sampling(n=2))
        assert sum(1 for r in script.requests if r["n"] > 1) == asked_for_n == 1  # remembered: no second try with n > 1


def test_server_ignoring_n_is_topped_up_and_threads_share_the_bound() -> None:
    script = Script(ignore_n=True, delay_s=0.1)
    with serving(script.app()) as url:
        client = OpenAIChatModel(url, "scripted", max_concurrency=3)
        assert len(client.complete(MESSAGES, Sampling(n=4))) == 4
        threads = [threading.Thread(target=client.complete, args=(MESSAGES, Sampling(n=1))) for _ in range(9)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert script.max_in_flight == 3


# --- factory ------------------------------------------------------------------------------------


def test_factory_builds_each_backend_from_settings(tiny: dict[str, Path]) -> None:
    script = Script(reply=PROGRAM_REPLY)
    with serving(script.app()) as url:
        settings = Settings(
            coder_model_backend="openai",
            coder_openai_base_url=url,
            coder_openai_api_key="sk-test-123",
            coder_max_concurrency=3,
            coder_max_retries=1,
        )
        generator = build_generator(settings=settings)
        assert isinstance(generator, LLMKernelGenerator) and generator.chat_model.max_concurrency == 3
        [draft] = generator.generate(RELU_MODULE, "triton", Sampling(n=1))
    assert draft.declined is None and draft.source is not None and "class ModelNew" in draft.source
    assert draft.model == "scripted" and draft.raw.startswith("Let me fuse it.")
    assert script.headers[0]["authorization"] == "Bearer sk-test-123"
    assert "sk-test-123" not in repr(settings) and "sk-test-123" not in str(generator.describe())

    hf_generator = build_generator("hf", Settings(coder_hf_model_path=tiny["model"], coder_lora_path=tiny["lora_b"]))
    assert hf_generator.describe()["adapter"] == "lora-b"
    switch_model(hf_generator, "alpha", str(tiny["lora_a"]))
    assert hf_generator.generate(RELU_MODULE, "cuda", Sampling(n=1, max_tokens=4))[0].model == "alpha"
    switch_model(hf_generator, "tiny")
    assert hf_generator.generate(RELU_MODULE, "cuda", Sampling(n=1, max_tokens=4))[0].model == "tiny"

    with pytest.raises(ValueError, match="KZ_CODER_HF_MODEL_PATH"):
        build_chat_model("hf", Settings())


def test_factory_default_is_the_template_generator() -> None:
    template = build_generator(settings=Settings())  # the offline default
    assert "template" in template.name
    with pytest.raises(ValueError, match="serves no model"):
        switch_model(template, "x")
