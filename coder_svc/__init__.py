"""Coder service: kernel prompts, best-of-n kernel generation (LLM backends or the template teacher).

Its face, what other packages may import (loaded on first use: see ``services.faces``):
``build_generator`` and ``switch_model`` (the configured kernel generator, and what it serves),
``KernelGenerator``, ``KernelDraft`` and ``KernelBackend`` (what generators promise),
``kernel_messages`` and ``system_prompt_for`` (the exact prompt the Coder serves, for training on the
same text), ``best_of_n`` (generate, verify, pick), ``discover`` (the problem files of a KernelBench
tree or folder), ``install_cli``. The chat models behind the LLM
backends are the platform's (``services.llm``): the Proposer and the trainer use them too.
"""

from typing import TYPE_CHECKING

from services.faces import lazy_face

if TYPE_CHECKING:
    from coder_svc.best_of_n import best_of_n
    from coder_svc.cli import install_cli
    from coder_svc.drafts import KernelBackend, KernelDraft, KernelGenerator
    from coder_svc.evaluation.harness import discover
    from coder_svc.generators import build_generator, switch_model
    from coder_svc.prompts import kernel_messages, system_prompt_for

__all__ = [
    "KernelBackend",
    "KernelDraft",
    "KernelGenerator",
    "best_of_n",
    "build_generator",
    "discover",
    "install_cli",
    "kernel_messages",
    "switch_model",
    "system_prompt_for",
]
__getattr__ = lazy_face(
    __name__,
    {
        "KernelBackend": "coder_svc.drafts",
        "KernelDraft": "coder_svc.drafts",
        "KernelGenerator": "coder_svc.drafts",
        "best_of_n": "coder_svc.best_of_n",
        "build_generator": "coder_svc.generators",
        "discover": "coder_svc.evaluation.harness",
        "install_cli": "coder_svc.cli",
        "kernel_messages": "coder_svc.prompts",
        "switch_model": "coder_svc.generators",
        "system_prompt_for": "coder_svc.prompts",
    },
)
