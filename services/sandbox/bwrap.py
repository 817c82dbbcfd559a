"""bubblewrap command lines: the preferred isolation.

The child sees only what it needs, bound read-only: the system's programs and libraries (``/usr``
and its merged-``/usr`` links), a few files of ``/etc`` (the loader's cache, users and groups,
alternatives; never shadow, ssh or the host's other configuration), ``/sys``, the Python
installation and every import path (of this checkout only its package directories: never its
``.env``, ``.git`` or data), a CUDA toolkit outside ``/usr`` where ``CUDA_HOME`` names one, and the
confinement's own dirs. The root itself is an empty read-only tmpfs, so other checkouts, home
directories, ``/var`` and ``/srv`` are not there at all. It gets a private /tmp, /proc of its own
PID namespace, a minimal /dev (plus the NVIDIA nodes for GPU work), no network and no System V IPC
of the host. ``--cap-drop ALL`` matters when the service runs as root: bwrap started by root
otherwise keeps every capability inside. The child still runs as uid 0 then: run the service as a
dedicated user in production.

Hidden paths (the service user's HOME, /run with its database and Docker sockets, and the
confinement's ``hidden_dirs``) are covered by an empty tmpfs where a bind would otherwise show them.
Unix sockets ignore read-only mounts and network namespaces, which is why /run is hidden. If the
running Python lives under a hidden dir (pyenv under /root), its prefixes are bound back
read-only so Python children work.
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

from services.sandbox.confinement import Confinement

_ALWAYS_HIDDEN = (Path("/run"), Path("/var/run"))
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/sys")
# What of /etc programs read: the dynamic loader, user and group names, alternatives (cc -> gcc),
# name-service and time-zone settings. Nothing with secrets.
ETC_ENTRIES = (
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "alternatives",
    "passwd",
    "group",
    "nsswitch.conf",
    "hosts",
    "host.conf",
    "localtime",
    "timezone",
    "os-release",
    "debian_version",
    "lsb-release",
    "gai.conf",
)
CHECKOUT = Path(os.path.realpath(__file__)).parents[2]


def bwrap_argv(bwrap: str, argv: Sequence[str], confinement: Confinement, cwd: Path | None) -> list[str]:
    """The full bwrap command that runs ``argv`` under ``confinement``."""
    args = [bwrap, "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    for link in SYSTEM_DIRS:  # merged /usr: /bin -> usr/bin and kin
        path = Path(link)
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), link]
    if confinement.gpu:
        # Only the NVIDIA nodes: all of /dev would hand uid 0 the raw disks.
        for node in sorted(glob.glob("/dev/nvidia*")):
            args += ["--dev-bind", node, node]
    # Parents before children, so a writable dir under a hidden one (or under /tmp) is bound
    # on top of the tmpfs instead of being covered by it; at equal paths the bind wins.
    mounts: list[tuple[int, int, list[str]]] = []
    for path in _hidden_paths(confinement):
        # A file gets /dev/null on a nodev mount: opening it fails with EACCES.
        op = ["--tmpfs", str(path)] if path.is_dir() else ["--ro-bind", "/dev/null", str(path)]
        mounts.append((len(path.parts), 0, op))
    for path in _visible(confinement) + [_real(p) for p in confinement.readonly_dirs]:
        mounts.append((len(path.parts), 1, ["--ro-bind", str(path), str(path)]))
    for path in (_real(p) for p in confinement.writable_dirs):
        mounts.append((len(path.parts), 2, ["--bind", str(path), str(path)]))
    for _, _, op in sorted(mounts, key=lambda m: m[:2]):
        args += op
    args += ["--remount-ro", "/", "--unshare-pid", "--unshare-ipc", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    if not confinement.network:
        args.append("--unshare-net")
    args += ["--chdir", str(cwd or "/tmp"), "--", *argv]
    return args


def _real(path: Path) -> Path:
    return Path(os.path.realpath(path))


def _hidden_paths(confinement: Confinement) -> list[Path]:
    candidates = [Path.home(), Path(pwd.getpwuid(os.getuid()).pw_dir), *_ALWAYS_HIDDEN, *confinement.hidden_dirs]
    hidden: list[Path] = []
    for path in candidates:
        # A symlink (/var/run -> /run) is hidden through its target; "/" as HOME must not be.
        if path.is_symlink() or not path.exists():
            continue
        real = _real(path)
        if real != Path("/") and real not in hidden:
            hidden.append(real)
    return hidden


def _visible(confinement: Confinement) -> list[Path]:
    """What the child may read besides the confinement's dirs: the system, the Python installation and its
    import path. Of this checkout only its package directories; nothing inside the confinement's hidden
    dirs (those hold secrets)."""
    secret = [_real(p) for p in confinement.hidden_dirs]
    system = [Path(p) for p in SYSTEM_DIRS if Path(p).is_dir() and not Path(p).is_symlink()]
    etc = [Path("/etc") / name for name in ETC_ENTRIES if (Path("/etc") / name).exists()]
    prefixes = {_real(Path(p)) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
    imports = {_real(Path(p)) for p in sys.path if p and Path(p).is_dir()}
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    toolkits = {_real(Path(cuda_home))} if cuda_home and Path(cuda_home).is_dir() else set()
    packages = {p for p in CHECKOUT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    roots = prefixes | toolkits | packages | (imports - {CHECKOUT})
    chosen = [
        p for p in sorted(roots) if not any(p.is_relative_to(c) for c in system) and not any(p.is_relative_to(s) for s in secret)
    ]
    return system + etc + chosen


@functools.cache
def bwrap_probe() -> tuple[str | None, str]:
    """(path to a working bwrap or None, why not). Run once: a real sandboxed /bin/true."""
    bwrap = shutil.which("bwrap")
    true = shutil.which("true")
    if bwrap is None or true is None:
        return None, "bwrap is not installed"
    try:
        done = subprocess.run(
            bwrap_argv(bwrap, [true], Confinement(), None),
            env={"PATH": "/usr/bin:/bin"},
            capture_output=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"bwrap probe failed: {exc}"
    if done.returncode != 0:
        return None, f"bwrap probe exited {done.returncode}: {done.stderr.decode(errors='replace').strip()}"
    return bwrap, ""
