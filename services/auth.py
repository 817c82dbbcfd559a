"""API keys: random tokens shown once, stored as SHA-256 hashes, revocable; admin keys may also
change what the platform serves (``require_admin_key``)."""

from __future__ import annotations

import hashlib
import secrets
from datetime import UTC, datetime
from typing import cast

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import select

from services.config import get_settings
from services.db.models import ApiKey
from services.db.session import session_scope

KEY_PREFIX = "kz_"
_bearer = HTTPBearer(auto_error=False)
_header = APIKeyHeader(name="X-API-Key", auto_error=False)


def hash_key(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode()).hexdigest()


def create_api_key(name: str, *, admin: bool = False) -> tuple[ApiKey, str]:
    """Create a key; the plaintext is returned once and never stored."""
    plaintext = KEY_PREFIX + secrets.token_urlsafe(32)
    with session_scope() as session:
        key = ApiKey(name=name, prefix=plaintext[:10], key_hash=hash_key(plaintext), admin=admin)
        session.add(key)
    return key, plaintext


def list_api_keys() -> list[ApiKey]:
    with session_scope() as session:
        return list(session.scalars(select(ApiKey).order_by(ApiKey.created_at)))


def revoke_api_key(key_id_or_prefix: str) -> ApiKey | None:
    with session_scope() as session:
        key = (
            session.get(ApiKey, key_id_or_prefix)
            or session.scalars(select(ApiKey).where(ApiKey.prefix == key_id_or_prefix)).first()
        )
        if key is not None and key.revoked_at is None:
            key.revoked_at = datetime.now(UTC)
        return key


def active_key(plaintext: str) -> ApiKey | None:
    """The key this plaintext names, unless it is unknown or revoked."""
    with session_scope() as session:
        key = session.scalars(select(ApiKey).where(ApiKey.key_hash == hash_key(plaintext))).first()
        return key if key is not None and key.revoked_at is None else None


def is_valid_key(plaintext: str) -> bool:
    return active_key(plaintext) is not None


# Routes whose callers cannot send headers (OpenRLHF's remote reward client posts to a bare URL): they also
# take the key as ``?key=``. Only these: a key in a URL is easier to leak (proxies log URLs).
QUERY_KEY_PATHS = frozenset({"/v1/get_reward"})


async def presented_key(request: Request) -> str | None:
    """The key a request carries in ``Authorization: Bearer`` or ``X-API-Key``, read from its headers alone
    (or its URL's ``key``, on the routes that allow it)."""
    bearer = await _bearer(request)
    query_key = request.query_params.get("key") if request.url.path in QUERY_KEY_PATHS else None
    return (bearer.credentials if bearer else None) or await _header(request) or query_key


def authenticate(presented: str | None) -> ApiKey:
    """The active key ``presented`` names, else 401."""
    if not presented:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "missing API key: send 'Authorization: Bearer <key>'")
    key = active_key(presented)
    if key is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "invalid or revoked API key")
    return key


def _caller_key(request: Request, bearer: HTTPAuthorizationCredentials | None, header_key: str | None) -> ApiKey:
    # The key gate (services.api.key_gate) checked it before the body was read; an app without the gate checks it here.
    key = getattr(request.state, "api_key", None)
    if key is None:
        key = request.state.api_key = authenticate((bearer.credentials if bearer else None) or header_key)
    return cast(ApiKey, key)


def require_api_key(
    request: Request,
    bearer: HTTPAuthorizationCredentials | None = Depends(_bearer),
    header_key: str | None = Depends(_header),
) -> None:
    """FastAPI dependency: a valid key in ``Authorization: Bearer`` or ``X-API-Key``."""
    if get_settings().auth_enabled:
        _caller_key(request, bearer, header_key)


def require_admin_key(
    request: Request,
    bearer: HTTPAuthorizationCredentials | None = Depends(_bearer),
    header_key: str | None = Depends(_header),
) -> None:
    """FastAPI dependency: a valid key that is also an admin key."""
    if get_settings().auth_enabled and not _caller_key(request, bearer, header_key).admin:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN, "this route needs an admin API key (kernelzero apikey create NAME --admin)"
        )
