"""``kernelzero proposer ...``: mine API statistics, propose and validate modules."""

from __future__ import annotations

import typer

proposer_app = typer.Typer(help="Proposer: API statistics, module proposals, validation.", no_args_is_help=True)
