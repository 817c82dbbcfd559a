"""A process that can do no more work ends, and its jobs run again in a fresh one.

Some failures poison the process rather than the job: a CUDA context that met a sticky error (an illegal
address) fails every later call, so a GPU reward worker that went on would judge every later output on the
device "incorrect", or fail every later job, honest groups alike. Code that finds such a failure calls
``declare``. In a process that runs jobs (``exit_when_unfit``, from the first job on) that ends the process
at once, from whichever thread found out, as a kill would: an exception could be caught, replaced (a cleanup
that fails on the same lost context) or held up on its way while other threads' jobs went on. The jobs it
held are delivered again, their attempts counted (``max_job_attempts``), never lost and never stored twice.
Elsewhere (a CLI evaluating in its own process) ``declare`` raises ``ProcessUnfit``, an error like any other.

A failure that surfaces somewhere no one checked (a job's cleanup) is caught by the checks services add
(``add_check``), which the job's attempt runs before it stores a failure (``services.queue.jobs``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import NoReturn

import structlog

EXIT_UNFIT = 75  # EX_TEMPFAIL: what a supervisor sees; the process's jobs are not failed, only interrupted

log = structlog.get_logger()
_checks: list[Callable[[], str | None]] = []
_exits = False


class ProcessUnfit(RuntimeError):
    """This process can do no more work of its kind; the message says what failed."""


def exit_when_unfit() -> None:
    """This process runs jobs: from now on ``declare`` ends it."""
    global _exits
    _exits = True


def add_check(check: Callable[[], str | None]) -> None:
    """A check of this process's fitness (what failed, or None), run after a job failed (``check``)."""
    _checks.append(check)


def check(after: BaseException | None = None) -> None:
    """``declare`` what the first failing check says, if one fails (``after``: the failure that prompted the
    look, logged with it)."""
    for run in list(_checks):
        failed = run()
        if failed:
            declare(failed, after)


def declare(reason: str, after: BaseException | None = None) -> NoReturn:
    if _exits:
        log.critical("process.unfit", reason=reason[:500], exc_info=after)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(EXIT_UNFIT)
    raise ProcessUnfit(reason)
