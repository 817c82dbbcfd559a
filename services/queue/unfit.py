"""A process that can do no more work ends, and its jobs run again in a fresh one.

Some failures poison the process rather than the job: a CUDA context that met a sticky error (an illegal
address) fails every later call, so a GPU reward worker that went on would judge every later output on the
device "incorrect", honest ones of every group alike. Code that finds such a failure raises
``ProcessUnfit``; the job's attempt (``services.queue.jobs``) then ends the process at once, as a kill
would, and the job is delivered again, its attempts counted (``max_job_attempts``), never lost and never
stored twice. This module imports nothing, so the judge can raise it where no queue runs (the CLI): there
it is an error like any other.
"""

from __future__ import annotations

EXIT_UNFIT = 75  # EX_TEMPFAIL: what a supervisor sees; the process's jobs are not failed, only interrupted


class ProcessUnfit(RuntimeError):
    """This process can do no more work of its kind; the message says what failed."""
