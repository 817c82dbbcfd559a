"""The ``template`` kernel generator: traces a module with torch.fx (sandboxed) and writes fused
Triton kernels for its pointwise, reduction, softmax, normalisation and pooling chains. Deterministic;
not an LLM."""

from coder_svc.template.generator import TemplateGenerator

__all__ = ["TemplateGenerator"]
