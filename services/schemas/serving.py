"""What a role serves (the Coder's kernels, the Proposer's llm composer): the admin switch to a
model version and what ``GET /v1/admin/model`` reads back. One definition for every role."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from services.schemas.times import UTCDatetime

ModelBackend = Literal["template", "openai", "hf"]


class ModelSwitch(BaseModel):
    """What a role serves next: a model, or a LoRA adapter on top of one."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"name": "coder-v3", "adapter_path": "/models/store/coder-v3"}]})

    name: str = Field(
        ..., min_length=1, max_length=200, description="Served model name (OpenAI-compatible endpoints) or the adapter's name."
    )
    base_model: str | None = Field(
        None, max_length=500, description="Base model name or local path; default: the configured one."
    )
    adapter_path: str | None = Field(None, max_length=1000, description="LoRA adapter directory, as the workers see it.")


class ServingModel(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: str | None = Field(None, description="None while no switch was recorded: the configured model serves.")
    name: str = Field(description="The served model's name (or the adapter's).")
    base_model: str | None = Field(None, description="The base model under an adapter; None: the configured one.")
    adapter_path: str | None = Field(None, description="The LoRA adapter directory; None when a whole model serves.")
    backend: ModelBackend = Field(description="The model backend that serves it: template, openai or hf.")
    created_at: UTCDatetime | None = Field(None, description="When this version was recorded; None for the configured model.")
