"""``python -m kernelzero``: the ``kernelzero`` command."""

from kernelzero.cli import main

main()
