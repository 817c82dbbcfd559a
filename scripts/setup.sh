#!/usr/bin/env bash
# Sets KernelZero up on a Debian/Ubuntu machine: the system packages it needs, .venv, torch,
# the locked dependencies (requirements/dev.lock: extras kernels, train, postgres and dev), then the
# project itself (editable).
#
# Idempotent: it installs only what is missing, and when .venv already matches pyproject.toml
# it returns after a few checks. Environment knobs:
#   PYTHON              interpreter for .venv (default python3; must be >= 3.11)
#   KZ_TORCH_SPEC       torch requirement (default torch==2.13.0)
#   KZ_TORCH_INDEX_URL  index for torch, e.g. https://download.pytorch.org/whl/cpu on a machine
#                       whose pip does not already resolve torch==2.13.0 to a CPU wheel
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${KZ_TORCH_SPEC:-torch==2.13.0}
TORCH_INDEX_URL=${KZ_TORCH_INDEX_URL:-}
STAMP=.venv/.kernelzero-setup

say() { printf 'setup: %s\n' "$*"; }

# 1. System packages: Python's venv, a local Redis for `kernelzero up`, bubblewrap for the sandbox.
missing=()
command -v "$PYTHON" >/dev/null || missing+=(python3)
"$PYTHON" -c 'import ensurepip, venv' 2>/dev/null || missing+=(python3-venv)
command -v redis-server >/dev/null || missing+=(redis-server)
command -v bwrap >/dev/null || missing+=(bubblewrap)
if ((${#missing[@]})); then
    if [ "$(id -u)" -eq 0 ]; then
        as_root=()
    elif command -v sudo >/dev/null; then
        as_root=(sudo)
    else
        echo "setup: need root or sudo to install: ${missing[*]}" >&2
        exit 1
    fi
    say "installing ${missing[*]}"
    "${as_root[@]}" apt-get update -qq
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
    echo "setup: KernelZero needs Python >= 3.11; $PYTHON is $("$PYTHON" --version 2>&1). Set PYTHON=/path/to/python3.11" >&2
    exit 1
}

# 2. The virtual environment.
if [ ! -x .venv/bin/python ]; then
    say "creating .venv with $("$PYTHON" --version 2>&1)"
    "$PYTHON" -m venv .venv
fi

# 3. Python packages, skipped when .venv was set up from this very pyproject.toml, lock and torch spec.
# requirements/dev.lock pins every dependency with its hashes (scripts/lock.sh makes it from pyproject.toml);
# the images install requirements/runtime.lock, resolved within the same pins.
LOCK=requirements/dev.lock
want="$(cat pyproject.toml "$LOCK"; echo "$TORCH_SPEC $TORCH_INDEX_URL")"
want=$(printf '%s' "$want" | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] \
    && .venv/bin/python -c 'import importlib.metadata as m; m.version("torch"); m.version("kernelzero")' 2>/dev/null; then
    say ".venv is up to date"
else
    pip=(.venv/bin/python -m pip --disable-pip-version-check)
    # torch first, and a CPU build: left to the `kernels` extra, pip would take PyPI's default
    # Linux wheel, a multi-GB CUDA build. The lock leaves torch (and the CUDA libraries of its
    # CUDA builds) out, so this build is the one that stays.
    # On our machines torch==2.13.0 resolves to a local CPU wheel (pip's find-links).
    say "installing $TORCH_SPEC"
    "${pip[@]}" install ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "$TORCH_SPEC"
    say "installing the locked dependencies ($LOCK)"
    "${pip[@]}" install -q --require-hashes --no-deps -r "$LOCK"
    say "installing kernelzero (editable; its dependencies are the lock's)"
    "${pip[@]}" install -q --no-deps -e .
    "${pip[@]}" check
    echo "$want" > "$STAMP"
fi

say "done: .venv/bin/kernelzero up starts the platform, .venv/bin/pytest -q runs the tests"
