"""The Coder's commands: ``kernelzero generate``, ``kernelzero eval`` and ``kernelzero coder ...``."""

from __future__ import annotations

import typer

coder_app = typer.Typer(help="Coder: model serving helpers.", no_args_is_help=True)
