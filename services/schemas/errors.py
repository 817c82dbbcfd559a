"""The body of every error answer but 422 (FastAPI's validation shape): what went wrong, in words."""

from __future__ import annotations

from pydantic import BaseModel, Field


class ErrorAnswer(BaseModel):
    detail: str = Field(description="What went wrong, in words: the reason to show a person.")
