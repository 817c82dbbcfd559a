"""The number type of request fields: strict, so a JSON ``true`` is no number (pydantic's lax mode
reads it as 1), yet a JSON integer is a float; and finite, since ``1e400`` parses to infinity, which
neither the logic nor a JSON column takes. Integer fields use pydantic's ``StrictInt``."""

from __future__ import annotations

from typing import Annotated

from pydantic import AllowInfNan, Strict

StrictFiniteFloat = Annotated[float, Strict(), AllowInfNan(False)]
