"""What a verdict may carry back to the caller: bounded, and with the platform's secrets taken out.

A verdict's reason and details hold text the candidate's process wrote (exception messages, stderr
tails, its own observations), which it can fill with anything it can read. The sandbox keeps the
settings sources out of its sight (docs/ARCHITECTURE.md, "Trust boundary"); this is the second
line: every secret value the worker knows (its settings' keys and URLs with their passwords, the
local API key, secret-looking variables of its environment, the values of a ``.env`` next to it)
is replaced wherever it appears, and every string is cut to a bound, before a verdict is stored or
returned.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from services.config import Settings
from services.schemas.reward import Verdict

REASON_MAX_CHARS = 2000
DETAIL_MAX_CHARS = 4000
MIN_SECRET_CHARS = 8  # shorter values ("true", a port) are not secrets, and replacing them would garble reasons
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.I)
REDACTED = "[redacted]"


class Redactor:
    def __init__(self, settings: Settings) -> None:
        found: set[str] = set()
        for secret in (settings.api_key, settings.coder_openai_api_key):
            if secret is not None:
                found.add(secret.get_secret_value())
        for url in (settings.database_url, settings.redis_url):
            if url:
                found.add(url)
                password = urlsplit(url).password
                if password:
                    found.add(password)
        found |= _file_values(settings.api_key_file)
        found |= _dotenv_values(Path(".env"))
        found |= {value for name, value in os.environ.items() if SECRET_NAME.search(name)}
        self.secrets = sorted((s for s in found if len(s) >= MIN_SECRET_CHARS), key=len, reverse=True)

    def text(self, value: str, limit: int = DETAIL_MAX_CHARS) -> str:
        for secret in self.secrets:
            value = value.replace(secret, REDACTED)
        return value if len(value) <= limit else value[:limit] + "…"

    def verdict(self, verdict: Verdict) -> Verdict:
        verdict.reason = self.text(verdict.reason, REASON_MAX_CHARS)
        verdict.details = self._value(verdict.details)
        return verdict

    def _value(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.text(str(k), 200) if isinstance(k, str) else k: self._value(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self._value(v) for v in value]
        return value


def _file_values(path: Path) -> set[str]:
    try:
        return {path.read_text().strip()} - {""}
    except OSError:
        return set()


def _dotenv_values(path: Path) -> set[str]:
    """The values of ``NAME=value`` lines (what pydantic-settings reads from the worker's cwd)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return set()
    values = set()
    for line in lines:
        if "=" in line and not line.lstrip().startswith("#"):
            values.add(line.split("=", 1)[1].strip().strip("'\""))
    return values - {""}
