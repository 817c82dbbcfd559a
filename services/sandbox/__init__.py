"""Sandboxed child processes for untrusted code (candidate kernels, proposed modules).

Untrusted code never runs in a service process: each evaluation gets a child with a clean
environment, rlimits and a wall-clock limit after which its whole process tree is killed.
Isolation is bubblewrap where it works (read-only root, private /tmp, no network, own PID and
IPC namespaces, hidden HOME and data dirs; see ``bwrap``), else a documented weaker fallback
(see ``fallback``); ``KZ_SANDBOX=auto|bwrap|fallback`` chooses (see ``isolation``), and every
result records which one ran.
"""

from services.sandbox.confinement import Confinement, SandboxResult
from services.sandbox.isolation import sandbox_available
from services.sandbox.process import KilledBeforeRun, SandboxProcess, run_sandboxed

__all__ = ["Confinement", "KilledBeforeRun", "SandboxProcess", "SandboxResult", "run_sandboxed", "sandbox_available"]
