"""The fallback, for machines where bwrap is missing or cannot create its namespaces.

It is a clean environment, rlimits, a new session and a private temp dir (TMPDIR, HOME and the
default cwd), plus, when the service runs as root, ``unshare --net --pid --fork --kill-child
--mount-proc`` from util-linux: no network, and a PID namespace whose end kills every descendant
and keeps the child from signalling the parent. The namespace needs its own /proc (hence the
mount namespace): CUDA fails to initialise (error 304) when /proc shows another namespace's
PIDs (seen on the H200 machine). It does NOT give a read-only root, a private /tmp, hidden
dirs or dropped capabilities: a child running as root can write and read anything root can.
Without root (no unshare) the child also keeps the network, can signal processes of the same
user, and a grandchild that double-forks into a new session can outlive the run once its
parent has exited (the tree kill only reaches processes still linked to the child).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess

_NAMESPACES = ("--pid", "--fork", "--kill-child", "--mount-proc")


@functools.cache
def _unshare() -> str | None:
    """unshare, if this process may create network and PID namespaces (root only); probed once."""
    unshare = shutil.which("unshare")
    true = shutil.which("true")
    if os.geteuid() != 0 or unshare is None or true is None:
        return None
    try:
        done = subprocess.run([unshare, "--net", *_NAMESPACES, true], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return unshare if done.returncode == 0 else None


def fallback_prefix(network: bool) -> list[str]:
    """What to put in front of the child's argv."""
    unshare = _unshare()
    if unshare is None:
        return []
    return [unshare, *([] if network else ["--net"]), *_NAMESPACES]
