"""What a sandboxed child may do, and what it did."""

from __future__ import annotations

import signal as _signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType


@dataclass(frozen=True)
class Confinement:
    """Limits and visibility for one sandboxed child.

    ``max_processes`` sets RLIMIT_NPROC, which the kernel counts per *user*, over all of that
    user's threads (the service's own included), and does not enforce at all for root: when
    the service runs as root it is no fork-bomb guard (the process tree is still killed as a
    whole at the end of every run); under a dedicated user, size it above the service's own
    thread count.
    """

    wall_timeout_s: float = 60.0
    memory_bytes: int | None = 8 << 30
    """RLIMIT_AS. CUDA reserves a huge virtual address space: GPU children need None."""
    cpu_seconds: int | None = None
    max_processes: int | None = 512
    max_file_bytes: int = 1 << 30
    max_open_files: int = 1024
    writable_dirs: tuple[Path, ...] = ()
    """Bound read-write at the same path, even when they lie under a hidden dir or /tmp."""
    readonly_dirs: tuple[Path, ...] = ()
    """Extra read-only binds; useful to re-expose something under a hidden dir."""
    hidden_dirs: tuple[Path, ...] = ()
    """Covered by an empty tmpfs (a file: made unreadable), e.g. the platform data dir with the
    database and API keys. The service user's HOME and /run are always hidden (bwrap only)."""
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), hash=False)
    """The child's whole environment besides PATH/HOME/TMPDIR/LANG (which it may override);
    os.environ is never inherited because it holds the service's secrets."""
    gpu: bool = False
    """Expose the NVIDIA device nodes; otherwise /dev is a minimal private one."""
    network: bool = False
    max_output_bytes: int = 4 << 20
    """stdout and stderr are each cut at this size; the rest is read and discarded."""

    def __post_init__(self) -> None:
        # Normalise so a caller may pass lists or strings; frozen needs object.__setattr__.
        for name in ("writable_dirs", "readonly_dirs", "hidden_dirs"):
            object.__setattr__(self, name, tuple(Path(p).absolute() for p in getattr(self, name)))
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))
        if self.wall_timeout_s <= 0:
            raise ValueError("wall_timeout_s must be positive")


_LIMIT_SIGNALS = {
    _signal.SIGKILL: "likely out of memory",
    _signal.SIGXCPU: "CPU time limit",
    _signal.SIGXFSZ: "file size limit",
}


@dataclass
class SandboxResult:
    """How a sandboxed child ended; ``returncode`` is None when a signal killed it."""

    returncode: int | None
    signal: int | None
    timed_out: bool
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool
    stderr_truncated: bool
    wall_s: float
    isolation: str
    """"bwrap" or "fallback": consumers must be able to tell how well the child was isolated."""

    @property
    def killed_for_memory(self) -> bool:
        """Ended by SIGKILL that was not the wall-clock limit: the host's OOM killer, whose first
        choice a child is (``limits.OOM_SCORE_ADJ``); ``describe`` says "likely out of memory"."""
        return self.signal == _signal.SIGKILL and not self.timed_out

    def describe(self) -> str:
        """One line for a verdict's reason, e.g. "killed by SIGSEGV"."""
        if self.timed_out:
            text = f"timed out after {self.wall_s:.1f} s"
        elif self.signal is not None:
            try:
                name = _signal.Signals(self.signal).name
            except ValueError:
                name = f"signal {self.signal}"
            hint = next((why for sig, why in _LIMIT_SIGNALS.items() if sig == self.signal), None)
            text = f"killed by {name}" + (f" ({hint})" if hint else "")
        else:
            text = f"exited {self.returncode}"
        cut = [name for name, flag in (("stdout", self.stdout_truncated), ("stderr", self.stderr_truncated)) if flag]
        return text + (f"; {' and '.join(cut)} truncated" if cut else "")
