#!/usr/bin/env bash
# The test command: the style gate (ruff's lint, import order and format; mypy on the packages),
# then the test suite with the slowest tests listed. Extra arguments go to pytest (`-n 0` runs the
# suite in this one process).
#
# The suite runs in two pytest-xdist worker processes, whole files to a worker (tests within a file
# keep their order and module fixtures). Most tests wait on child processes (sandboxed evaluations,
# Celery workers, uvicorn), so two workers keep CI's two cores busy. Each worker is a pytest session
# of its own: its own Redis database, PostgreSQL database and temp dirs (tests/conftest.py).
#
# The interpreter runs pytest and mypy as modules: a console script's shebang names the path the venv
# was created at, which is wrong wherever .venv was copied or shared.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/python -m mypy
exec .venv/bin/python -m pytest -q --durations=15 --numprocesses 2 --dist loadfile "$@"
