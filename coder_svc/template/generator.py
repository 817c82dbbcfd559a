"""The ``template`` kernel generator: deterministic, rule-based, not a language model.

Trace the module in a sandboxed child (``trace``), group its ops into fused kernels (``fusion``),
write Triton source (``codegen``). Sampling is ignored except ``n``: the same module always gives
the same kernel, so one draft is returned however many are asked for.
"""

from __future__ import annotations

import hashlib
from typing import Any

from coder_svc.drafts import KernelBackend, KernelDraft
from coder_svc.template.codegen import VERSION, generate_source
from coder_svc.template.fusion import Plan, plan
from coder_svc.template.trace import TraceError, Tracer
from reward_svc import check_source
from services.config import Settings
from services.llm.chat import Sampling
from services.outcomes import Declined


class TemplateGenerator:
    name = "template"
    thread_safe = True  # stateless: each trace runs in its own sandboxed child

    def __init__(self, settings: Settings | None = None) -> None:
        self.tracer = Tracer(settings)

    def generate(self, module_source: str, backend: KernelBackend, sampling: Sampling) -> list[KernelDraft]:
        if sampling.n < 1:
            return []
        return [self.draft(module_source, backend)]

    def draft(self, module_source: str, backend: KernelBackend) -> KernelDraft:
        if backend != "triton":
            return self._declined(f"the template generator writes Triton only, not {backend}")
        try:
            graph = self.tracer.trace(module_source)
        except TraceError as exc:
            return self._declined(f"trace failed: {exc}")
        try:
            fused = plan(graph)
            details: dict[str, Any] = {"traced_on": graph.traced_on, **describe(fused)}
            if not fused.groups:
                return self._declined(no_fusable_reason(fused), details)
            source = generate_source(module_source, fused)
            violations = check_source(source)
        except Declined as exc:
            return self._declined(f"cannot write the forward: {exc}")
        except (SyntaxError, KeyError, TypeError, ValueError) as exc:  # a graph the trace child should not have printed
            return self._declined(f"cannot write the forward from this graph: {type(exc).__name__}: {exc}"[:300])
        if violations:
            return self._declined(f"the reward policy would reject the module's own code: {violations[0].describe()}", details)
        details["source_sha256"] = hashlib.sha256(source.encode()).hexdigest()
        return KernelDraft(source=source, raw=source, model="template", model_version=VERSION, details=details)

    @staticmethod
    def _declined(reason: str, details: dict[str, Any] | None = None) -> KernelDraft:
        return KernelDraft(source=None, raw="", model="template", model_version=VERSION, declined=reason, details=details or {})


def describe(fused: Plan) -> dict[str, Any]:
    """What was fused and what PyTorch still runs, for the candidate's details."""
    grouped = set(fused.group_of)
    torch_ops = [
        n.target if n.op != "call_module" or not n.module else n.module.cls.rsplit(".", 1)[-1]
        for n in fused.graph.nodes
        if n.op.startswith("call_") and n.name not in grouped and n.name not in fused.aliases
    ]
    return {
        "kernels": [{"ops": g.members, "reduction": g.reduction[1].kind if g.reduction else None} for g in fused.groups],
        "pytorch_ops": torch_ops,
        "unsupported": fused.unsupported,  # node -> why PyTorch still runs that op
    }


def no_fusable_reason(fused: Plan) -> str:
    ops = describe(fused)["pytorch_ops"]
    if not ops:
        return "no fusable op: the forward computes nothing"
    shown = ", ".join(dict.fromkeys(ops))
    why = "".join(f"; {name}: {reason}" for name, reason in fused.unsupported.items())
    return f"no fusable op: the module only runs {shown}{why}"
