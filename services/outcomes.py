"""The two ways the platform says no, one word each in every service.

- **Rejected**: untrusted code (a candidate kernel, a proposed module) was judged and turned down.
  ``rule`` names the check that fired: a reward guard (``Verdict.guard``), a validation rule
  (``ValidationOut.rule``).
- **Declined**: one of our own generators does not write what it was asked (the template generator
  cannot lower an op, a composer finds no module for an API set, an LLM's reply holds no program);
  the reason says why (``KernelDraft.declined``).
"""

from __future__ import annotations


class Rejected(Exception):
    def __init__(self, rule: str, reason: str) -> None:
        super().__init__(reason)
        self.rule, self.reason = rule, reason


class Declined(Exception):
    """The message says why."""
