"""A small OpenAI-compatible server for a local Hugging Face model (``kernelzero coder serve``).

For local use and tests where vLLM is not installed: the chat-completions subset the ``openai``
backend uses (``n``, ``temperature``, ``top_p``, ``max_tokens``, ``seed``, usage counts), the
model list with vLLM's ``root``/``parent`` fields, and vLLM's runtime LoRA routes. A request
naming a loaded adapter is answered by that adapter, as vLLM does. One generation at a time.
"""

from __future__ import annotations

import time
import uuid
from typing import Literal

from fastapi import FastAPI, HTTPException
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field

from services.llm.chat import Completion, Sampling
from services.llm.hf_local import HFChatModel


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: str


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")  # OpenAI clients send fields this server does not use

    model: str | None = None
    messages: list[ChatMessage] = Field(..., min_length=1)
    n: int = Field(1, ge=1, le=64)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int = Field(256, ge=1, le=32768)
    seed: int | None = None
    stream: bool = False
    logprobs: bool = False
    return_tokens_as_token_ids: bool = False  # vLLM's: tokens spelled "token_id:<id>"


class ChoiceMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class TokenLogprob(BaseModel):
    token: str
    logprob: float


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob]


class Choice(BaseModel):
    index: int
    message: ChoiceMessage
    finish_reason: str | None
    logprobs: ChoiceLogprobs | None = None


class UsageOut(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    system_fingerprint: str = Field(..., description="The served weights' version (base hash, adapter hash).")
    choices: list[Choice]
    usage: UsageOut


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "kernelzero"
    root: str
    parent: str | None = None
    version: str


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class LoadLoraRequest(BaseModel):
    lora_name: str = Field(..., min_length=1, max_length=200)
    lora_path: str = Field(..., min_length=1, max_length=1000)


class UnloadLoraRequest(BaseModel):
    lora_name: str = Field(..., min_length=1, max_length=200)


def create_openai_app(model: HFChatModel) -> FastAPI:
    app = FastAPI(title="KernelZero OpenAI-compatible model server", version="0.1.0")
    started = int(time.time())
    adapter_paths: dict[str, str] = {}

    @app.get("/v1/models")
    def list_models() -> ModelList:
        cards = [ModelCard(id=model.name, created=started, root=str(model.model_path), version=model.base_version)]
        cards += [
            ModelCard(
                id=name,
                created=started,
                root=adapter_paths.get(name, ""),
                parent=model.name,
                version=f"{model.base_version}+{version}",
            )
            for name, version in sorted(model.adapters.items())
        ]
        return ModelList(data=cards)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: ChatCompletionRequest) -> ChatCompletionResponse:
        if request.stream:
            raise HTTPException(400, "stream=true is not supported by this server")
        sampling = Sampling(
            n=request.n,
            temperature=request.temperature,
            top_p=request.top_p,
            max_tokens=request.max_tokens,
            seed=request.seed,
            logprobs=request.logprobs,
        )
        messages = [m.model_dump() for m in request.messages]
        try:
            [(completions, usage)] = await run_in_threadpool(model.sample, [messages], sampling, request.model)
        except KeyError:
            raise HTTPException(404, f"The model `{request.model}` does not exist.") from None
        return ChatCompletionResponse(
            id=f"chatcmpl-{uuid.uuid4().hex}",
            created=int(time.time()),
            model=completions[0].model,
            system_fingerprint=completions[0].model_version or model.base_version,
            choices=[
                Choice(
                    index=i,
                    message=ChoiceMessage(content=c.text),
                    finish_reason=c.finish_reason,
                    logprobs=_logprobs(c, model, request.return_tokens_as_token_ids) if request.logprobs else None,
                )
                for i, c in enumerate(completions)
            ],
            usage=UsageOut(
                prompt_tokens=usage.prompt_tokens,
                completion_tokens=usage.completion_tokens,
                total_tokens=usage.prompt_tokens + usage.completion_tokens,
            ),
        )

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(request: LoadLoraRequest) -> str:
        try:
            await run_in_threadpool(model.load_adapter, request.lora_name, request.lora_path)
        except (OSError, ValueError) as exc:
            raise HTTPException(400, f"could not load adapter {request.lora_name!r} from {request.lora_path}: {exc}") from exc
        adapter_paths[request.lora_name] = request.lora_path
        return f"Success: LoRA adapter '{request.lora_name}' added successfully."

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(request: UnloadLoraRequest) -> str:
        try:
            await run_in_threadpool(model.unload_adapter, request.lora_name)
        except KeyError as exc:
            raise HTTPException(404, str(exc.args[0])) from exc
        adapter_paths.pop(request.lora_name, None)
        return f"Success: LoRA adapter '{request.lora_name}' removed successfully."

    return app


def _logprobs(completion: Completion, model: HFChatModel, as_ids: bool) -> ChoiceLogprobs | None:
    """vLLM's ``logprobs.content``: each sampled token (as ``token_id:<id>`` where asked) and its log-probability."""
    tokens = completion.tokens
    if tokens is None or tokens.logprobs is None:
        return None
    spelled = [f"token_id:{t}" if as_ids else str(model.tokenizer.convert_ids_to_tokens(t)) for t in tokens.completion_ids]
    return ChoiceLogprobs(content=[TokenLogprob(token=t, logprob=lp) for t, lp in zip(spelled, tokens.logprobs)])
