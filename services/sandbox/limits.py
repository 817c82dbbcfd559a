"""Resource limits, applied in the forked child just before it execs bwrap or the command.

Limits are inherited across exec and fork, so setting them on the bwrap (or unshare) process
covers everything the sandbox starts; RLIMIT_AS then also applies to bwrap itself, which
needs only a few MiB.

A GPU child has no RLIMIT_AS (CUDA reserves a huge virtual address space), so the host's memory
can still run out. The child is therefore made the kernel's first choice when it does
(oom_score_adj 1000): the OOM killer ends an untrusted child, which becomes a verdict, and not
the service or worker process, whose RSS may well be larger.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Callable

from services.sandbox.confinement import Confinement

Limits = tuple[tuple[int, int], ...]


def rlimits(confinement: Confinement) -> Limits:
    """(resource, value) pairs to set as both soft and hard limit, so the child cannot raise them."""
    pairs = [
        (resource.RLIMIT_CORE, 0),  # a crashing kernel must not litter the job dir with core files
        (resource.RLIMIT_FSIZE, confinement.max_file_bytes),
        (resource.RLIMIT_NOFILE, confinement.max_open_files),
    ]
    if confinement.memory_bytes is not None:
        pairs.append((resource.RLIMIT_AS, confinement.memory_bytes))
    if confinement.cpu_seconds is not None:
        pairs.append((resource.RLIMIT_CPU, confinement.cpu_seconds))
    if confinement.max_processes is not None:
        pairs.append((resource.RLIMIT_NPROC, confinement.max_processes))
    return tuple((res, _within_hard(res, value)) for res, value in pairs)


def _within_hard(res: int, value: int) -> int:
    # Raising a hard limit needs privilege: never ask for more than the service itself has.
    hard = resource.getrlimit(res)[1]
    return value if hard == resource.RLIM_INFINITY else min(value, hard)


OOM_SCORE_ADJ = 1000  # the most a process may ask for; lowering it again needs CAP_SYS_RESOURCE


def preexec(limits: Limits) -> Callable[[], None]:
    """A preexec_fn that only calls setrlimit and marks the child as the OOM killer's first victim:
    the values are computed in the parent, so the forked child does as little Python work as
    possible (preexec_fn runs between fork and exec)."""
    score = str(OOM_SCORE_ADJ).encode()

    def apply() -> None:
        for res, value in limits:
            resource.setrlimit(res, (value, value))
        try:
            fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
        except OSError:  # no procfs (gVisor and the like): the limits above still hold
            return
        try:
            os.write(fd, score)
        finally:
            os.close(fd)

    return apply
