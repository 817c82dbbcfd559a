"""Resource limits, applied in the forked child just before it execs bwrap or the command.

Limits are inherited across exec and fork, so setting them on the bwrap (or unshare) process
covers everything the sandbox starts; RLIMIT_AS then also applies to bwrap itself, which
needs only a few MiB.
"""

from __future__ import annotations

import resource
from collections.abc import Callable

from services.sandbox.policy import SandboxPolicy

Limits = tuple[tuple[int, int], ...]


def rlimits(policy: SandboxPolicy) -> Limits:
    """(resource, value) pairs to set as both soft and hard limit, so the child cannot raise them."""
    pairs = [
        (resource.RLIMIT_CORE, 0),  # a crashing kernel must not litter the job dir with core files
        (resource.RLIMIT_FSIZE, policy.max_file_bytes),
        (resource.RLIMIT_NOFILE, policy.max_open_files),
    ]
    if policy.memory_bytes is not None:
        pairs.append((resource.RLIMIT_AS, policy.memory_bytes))
    if policy.cpu_seconds is not None:
        pairs.append((resource.RLIMIT_CPU, policy.cpu_seconds))
    if policy.max_processes is not None:
        pairs.append((resource.RLIMIT_NPROC, policy.max_processes))
    return tuple((res, _within_hard(res, value)) for res, value in pairs)


def _within_hard(res: int, value: int) -> int:
    # Raising a hard limit needs privilege: never ask for more than the service itself has.
    hard = resource.getrlimit(res)[1]
    return value if hard == resource.RLIM_INFINITY else min(value, hard)


def preexec(limits: Limits) -> Callable[[], None]:
    """A preexec_fn that only calls setrlimit: the values are computed in the parent, so the
    forked child does as little Python work as possible (preexec_fn runs between fork and exec)."""

    def apply() -> None:
        for res, value in limits:
            resource.setrlimit(res, (value, value))

    return apply
