"""The composition root: the ``kernelzero`` command, the platform's commands and every service's.

The one package that may import every service (through its face); nothing imports it.
"""
