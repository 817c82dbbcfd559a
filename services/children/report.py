"""How a sandboxed child hands its result to its pool: ``result.json``, signed.

The pool (``pool.Child.run``) puts a fresh key in every job's spec; the child's entry
point takes it out before anything untrusted runs and signs its result with it. The worker reads
only a result whose signature holds: a ``result.json`` written by anything else in the child (native
code of a candidate that found the work dir writable) is recognised as forged. Kept free of heavy
imports: every child entry point uses it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import stat
from pathlib import Path
from typing import Any, Literal

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


class OversizedFile(OSError):
    def __init__(self, path: Path, size: int) -> None:
        super().__init__(f"{path.name} holds {size} bytes")
        self.size = size


def open_regular(path: Path, max_bytes: int) -> int:
    """A descriptor of ``path`` if it is a regular file of at most ``max_bytes``: opened without
    following a link or blocking on a FIFO, checked with fstat (a child's files are the child's to
    make: a link to a host file, a FIFO that never answers, a device of endless bytes). OSError
    otherwise (``OversizedFile`` when it is too large)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{path.name} is not a regular file")
        if info.st_size > max_bytes:
            raise OversizedFile(path, info.st_size)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: Path, max_bytes: int) -> bytes:
    """The bytes of a regular file of at most ``max_bytes`` (``open_regular``); OSError otherwise."""
    with os.fdopen(open_regular(path, max_bytes), "rb") as handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:  # it grew after the check
        raise OversizedFile(path, len(data))
    return data


def read_result(path: Path, key: str, max_bytes: int) -> dict[str, Any] | None | Literal[False]:
    """The result the child's harness signed; None where there is none (too large, not a regular
    file, unreadable, not a JSON object); False where a result is there but not the harness's (a forgery)."""
    try:
        envelope = json.loads(read_regular(path, max_bytes))
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
