"""Code that runs inside the sandboxed child process, never in a service.

The reference and the candidate run in *different* children: the candidate's process never holds
the reference module, its outputs or the input seed, so it cannot copy, call or reuse them. Each
child writes its tensors and observations to its work directory; the worker judges (verify.py).
"""
