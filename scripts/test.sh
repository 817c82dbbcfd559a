#!/usr/bin/env bash
# The test command: the style gate (ruff's lint, import order and format; mypy on the packages),
# then the test suite with the slowest tests listed. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
exec .venv/bin/pytest -q --durations=15 "$@"
