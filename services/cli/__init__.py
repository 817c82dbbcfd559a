"""The ``kernelzero`` command line."""
