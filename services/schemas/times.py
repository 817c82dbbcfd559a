"""The time type of answers: a datetime always sent with its offset. The database stores UTC
(``utcnow``), but SQLite gives it back naive, and an ISO time without an offset is no RFC 3339
``date-time`` (what the OpenAPI schema promises): a client would have to guess its zone."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from pydantic import AfterValidator


def as_utc(value: datetime) -> datetime:
    """A time the database gave back, with its zone (SQLite returns the UTC it was given without one)."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


UTCDatetime = Annotated[datetime, AfterValidator(as_utc)]
