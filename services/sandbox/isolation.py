"""Which isolation this machine gets: bwrap when it works, else the fallback.

The environment variable ``KZ_SANDBOX`` chooses: ``auto`` (default: bwrap if its probe passes,
else fallback with a warning), ``bwrap`` (required: an error if it does not work, so a
production host never degrades silently) or ``fallback`` (never bwrap). It is read from
os.environ on every call, not from the settings object, so tests and benchmarks can switch.
"""

from __future__ import annotations

import functools
import logging
import os

from services.sandbox.bwrap import bwrap_probe

log = logging.getLogger(__name__)

MODES = ("auto", "bwrap", "fallback")


def sandbox_available() -> str:
    """ "bwrap" or "fallback", as KZ_SANDBOX and the (cached) bwrap probe decide."""
    choice = os.environ.get("KZ_SANDBOX", "auto").strip().lower() or "auto"
    if choice not in MODES:
        raise ValueError(f"KZ_SANDBOX must be one of {', '.join(MODES)}, not {choice!r}")
    if choice == "fallback":
        return "fallback"
    bwrap, why = bwrap_probe()
    if bwrap is not None:
        return "bwrap"
    if choice == "bwrap":
        raise RuntimeError(f"KZ_SANDBOX=bwrap but bubblewrap does not work here: {why}")
    _warn_fallback(why)
    return "fallback"


@functools.cache
def _warn_fallback(why: str) -> None:
    log.warning("sandbox: bubblewrap unavailable (%s); using the weaker fallback isolation", why)
