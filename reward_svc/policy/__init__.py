"""The capability policy: what a candidate's (or a proposed module's) source may reach, checked
before anything of it runs. ``source``: its Python, on the syntax tree, in the worker. ``native``:
its ``load_inline`` C++/CUDA and build flags, in the child before they compile."""

from reward_svc.policy.native import check_native_sources
from reward_svc.policy.source import PolicyViolation, check_source, check_tree

__all__ = ["PolicyViolation", "check_native_sources", "check_source", "check_tree"]
