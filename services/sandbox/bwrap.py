"""bubblewrap command lines: the preferred isolation.

The child sees the host root read-only, a private /tmp, /proc of its own PID namespace, a
minimal /dev (plus the NVIDIA nodes for GPU work), no network and no System V IPC of the host.
``--cap-drop ALL`` matters when the service runs as root: bwrap started by root otherwise keeps
every capability inside, and the child could simply remount / read-write. The child still runs
as uid 0 then, so root-owned files that are not hidden stay readable (e.g. /etc/shadow): run the
service as a dedicated user in production.

Hidden paths (the service user's HOME, /run with its database and Docker sockets, and the
policy's ``hidden_dirs``) are covered by an empty tmpfs. Unix sockets ignore read-only mounts
and network namespaces, which is why /run is hidden. If the running Python lives under a
hidden dir (pyenv under /root), its prefixes are bound back read-only so Python children work.
"""

from __future__ import annotations

import functools
import glob
import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from services.sandbox.policy import SandboxPolicy

_ALWAYS_HIDDEN = (Path("/run"), Path("/var/run"))


def bwrap_argv(bwrap: str, argv: Sequence[str], policy: SandboxPolicy, cwd: Path | None) -> list[str]:
    """The full bwrap command that runs ``argv`` under ``policy``."""
    args = [bwrap, "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    if policy.gpu:
        # Only the NVIDIA nodes: all of /dev would hand uid 0 the raw disks.
        for node in sorted(glob.glob("/dev/nvidia*")):
            args += ["--dev-bind", node, node]
    # Parents before children, so a writable dir under a hidden one (or under /tmp) is bound
    # on top of the tmpfs instead of being covered by it; at equal paths the bind wins.
    mounts: list[tuple[int, int, list[str]]] = []
    for path in _hidden_paths(policy):
        # A file gets /dev/null on a nodev mount: opening it fails with EACCES.
        op = ["--tmpfs", str(path)] if path.is_dir() else ["--ro-bind", "/dev/null", str(path)]
        mounts.append((len(path.parts), 0, op))
    for path in _reexposed(policy) + [_real(p) for p in policy.readonly_dirs]:
        mounts.append((len(path.parts), 1, ["--ro-bind", str(path), str(path)]))
    for path in (_real(p) for p in policy.writable_dirs):
        mounts.append((len(path.parts), 2, ["--bind", str(path), str(path)]))
    for _, _, op in sorted(mounts, key=lambda m: m[:2]):
        args += op
    args += ["--unshare-pid", "--unshare-ipc", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    if not policy.network:
        args.append("--unshare-net")
    args += ["--chdir", str(cwd or "/tmp"), "--", *argv]
    return args


def _real(path: Path) -> Path:
    return Path(os.path.realpath(path))


def _hidden_paths(policy: SandboxPolicy) -> list[Path]:
    candidates = [Path.home(), Path(pwd.getpwuid(os.getuid()).pw_dir), *_ALWAYS_HIDDEN, *policy.hidden_dirs]
    hidden: list[Path] = []
    for path in candidates:
        # A symlink (/var/run -> /run) is hidden through its target; "/" as HOME must not be.
        if path.is_symlink() or not path.exists():
            continue
        real = _real(path)
        if real != Path("/") and real not in hidden:
            hidden.append(real)
    return hidden


def _reexposed(policy: SandboxPolicy) -> list[Path]:
    """The running interpreter's installation and import path, where the private /tmp or a hidden
    dir would otherwise cover them (a checkout or venv under /tmp or HOME), read-only. Import
    paths inside the policy's own hidden dirs stay hidden: those hold secrets."""
    hidden = _hidden_paths(policy)
    covering = [*hidden, Path("/tmp")]
    secret = [_real(p) for p in policy.hidden_dirs]
    prefixes = {_real(Path(p)) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
    imports = {_real(Path(p)) for p in sys.path if p and Path(p).is_dir()}
    imports.add(_real(Path(__file__)).parents[2])  # this checkout: an editable install is not on sys.path
    exposed = {p for p in prefixes if any(p.is_relative_to(h) for h in covering)}
    exposed |= {p for p in imports if any(p.is_relative_to(h) for h in covering) and not any(p.is_relative_to(s) for s in secret)}
    return sorted(exposed)


@functools.cache
def bwrap_probe() -> tuple[str | None, str]:
    """(path to a working bwrap or None, why not). Run once: a real sandboxed /bin/true."""
    bwrap = shutil.which("bwrap")
    true = shutil.which("true")
    if bwrap is None or true is None:
        return None, "bwrap is not installed"
    try:
        done = subprocess.run(
            bwrap_argv(bwrap, [true], SandboxPolicy(), None),
            env={"PATH": "/usr/bin:/bin"},
            capture_output=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"bwrap probe failed: {exc}"
    if done.returncode != 0:
        return None, f"bwrap probe exited {done.returncode}: {done.stderr.decode(errors='replace').strip()}"
    return bwrap, ""
