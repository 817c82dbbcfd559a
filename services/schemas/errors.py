"""The body of every error answer but 422 (FastAPI's validation shape): what went wrong, in words."""

from __future__ import annotations

from pydantic import BaseModel


class ErrorAnswer(BaseModel):
    detail: str
