"""How a sandboxed child hands its result to its pool: ``result.json``, signed.

The pool (``reward_svc.sandbox.Child.run``) puts a fresh key in every job's spec; the child's entry
point takes it out before anything untrusted runs and signs its result with it. The worker reads
only a result whose signature holds: a ``result.json`` written by anything else in the child (native
code of a candidate that found the work dir writable) is recognised as forged. Kept free of heavy
imports: every child entry point uses it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path
from typing import Any

RESULT_FILE = "result.json"
KEY_FIELD = "result_key"
AUDIT_LOG = "audit.log"  # what a candidate child's audit hook refused, a line each (harness/instrument.py)


def result_mac(key: str, payload: str) -> str:
    return hmac.new(bytes.fromhex(key), payload.encode(), hashlib.sha256).hexdigest()


def take_key(spec: dict[str, Any]) -> str | None:
    """The signing key, removed from the spec (nothing the job runs sees it there)."""
    key = spec.pop(KEY_FIELD, None)
    return key if isinstance(key, str) else None


def write_result(workdir: Path, key: str | None, result: dict[str, Any]) -> None:
    payload = json.dumps(result, default=str)
    envelope = {"result": payload, "mac": result_mac(key, payload)} if key else {"result": payload}
    (workdir / RESULT_FILE).write_text(json.dumps(envelope))


def read_result(path: Path, key: str, max_bytes: int) -> dict[str, Any] | None | bool:
    """The result the child's harness signed; None where there is none (too large, unreadable, not a
    JSON object); False where a result is there but not the harness's (a forgery)."""
    try:
        if path.stat().st_size > max_bytes:
            return None
        envelope = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return None
    if not (isinstance(envelope, dict) and isinstance(envelope.get("result"), str) and isinstance(envelope.get("mac"), str)):
        return False
    if not hmac.compare_digest(envelope["mac"], result_mac(key, envelope["result"])):
        return False
    try:
        result = json.loads(envelope["result"])
    except (ValueError, RecursionError):
        return None
    return result if isinstance(result, dict) else None
