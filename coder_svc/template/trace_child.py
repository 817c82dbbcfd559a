"""The trace child: builds the untrusted module, traces it with torch.fx, prints the op graph.

Runs only inside the sandbox, as a pooled child (``services.children.entry``: ``python -m
coder_svc.template.trace_child WORKDIR DEVICE``, the module source in its one job); the parent
never executes the module. Parameters and inputs are built on the 'meta'
device where the module allows it, so huge KernelBench shapes cost no memory; shapes come from
fx's ShapeProp. Answers one JSON object: ``{"graph": ...}`` or ``{"error": reason}``.
"""

from __future__ import annotations

import builtins
import math
import operator
import sys
from pathlib import Path
from typing import Any

from services.children.entry import serve

CONSTANT_TYPES = (bool, int, float, str, type(None))
MAX_CONSTANT_ELEMENTS = 64  # a tensor made from literals in forward; larger ones are declined


def _canonical_function(fn: Any) -> str:
    import torch

    name = getattr(fn, "__name__", None)
    if name:
        for prefix, namespace in (
            ("torch.nn.functional", torch.nn.functional),
            ("torch", torch),
            ("torch.special", torch.special),
            ("torch.linalg", torch.linalg),
            ("operator", operator),
            ("builtins", builtins),
            ("math", math),
        ):
            if getattr(namespace, name, None) is fn:
                return f"{prefix}.{name}"
    return f"unknown.{name or 'function'}".replace("<", "_").replace(">", "_")


def _arg(value: Any) -> Any:
    import torch
    import torch.fx

    if isinstance(value, torch.fx.Node):
        return {"node": value.name}
    if isinstance(value, float) and not math.isfinite(value):
        return {"opaque": repr(value)} if math.isnan(value) else value
    if isinstance(value, CONSTANT_TYPES):
        return value
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, slice):
        return {"slice": [_arg(value.start), _arg(value.stop), _arg(value.step)]}
    if isinstance(value, tuple):
        return {"tuple": [_arg(v) for v in value]}
    if isinstance(value, list):
        return [_arg(v) for v in value]
    return {"opaque": type(value).__name__}


def _meta(value: Any) -> Any:
    from torch.fx.passes.shape_prop import TensorMetadata

    if isinstance(value, TensorMetadata):
        return {"shape": list(value.shape), "dtype": str(value.dtype).removeprefix("torch.")}
    if isinstance(value, (tuple, list)) and value and any(isinstance(v, TensorMetadata) for v in value):
        return [_meta(v) if isinstance(v, TensorMetadata) else None for v in value]
    return None


def _symbolic_trace(model: Any) -> tuple[Any, set[str]]:
    """The traced module, and the attributes tracing added to the model: fx stores each tensor the
    forward makes from literals as one (``_tensor_constant0``)."""
    import torch.fx

    before = set(vars(model))
    graph_module = torch.fx.symbolic_trace(model)
    return graph_module, set(vars(model)) - before


def _module_info(module: Any) -> dict[str, Any]:
    cls = type(module)
    attrs = {
        k: _arg(v)
        for k, v in vars(module).items()
        if not k.startswith("_")
        and (isinstance(v, CONSTANT_TYPES) or (isinstance(v, tuple) and all(isinstance(x, CONSTANT_TYPES) for x in v)))
    }
    return {"cls": f"{cls.__module__}.{cls.__qualname__}".replace("<", "_").replace(">", "_"), "attrs": attrs}


def _build(module: Any, device: str) -> tuple[Any, list[Any]]:
    import torch

    torch.manual_seed(0)
    with torch.device(device):
        init = list(module.get_init_inputs()) if hasattr(module, "get_init_inputs") else []
        model = module.Model(*init)
        inputs = list(module.get_inputs())
    return model.eval(), inputs


def trace(source: str) -> dict[str, Any]:
    import types

    import torch
    import torch.fx
    from torch.fx.passes.shape_prop import ShapeProp

    # Executed from memory: the child's /tmp may be read-only when the parent runs from there.
    module = types.ModuleType("kz_traced")
    sys.modules["kz_traced"] = module
    exec(compile(source, "kz_traced.py", "exec"), module.__dict__)  # the sandboxed child's whole purpose
    for name in ("Model", "get_inputs"):
        if not hasattr(module, name):
            return {"error": f"the module defines no {name}"}
    traced_on = "meta"
    try:
        model, inputs = _build(module, "meta")
        graph_module, made = _symbolic_trace(model)
        ShapeProp(graph_module).propagate(*inputs)
    except (
        Exception
    ) as exc:  # some modules cannot build or run on meta (e.g. .item()): real tensors, under the sandbox memory limit
        print(f"meta trace failed: {exc!r}", file=sys.stderr)
        traced_on = "cpu"
        model, inputs = _build(module, "cpu")
        try:
            graph_module, made = _symbolic_trace(model)
        except Exception as exc:
            return {"error": f"torch.fx cannot trace the module: {type(exc).__name__}: {exc}"[:500]}
        ShapeProp(graph_module).propagate(*inputs)
    nodes = []
    for node in graph_module.graph.nodes:
        entry: dict[str, Any] = {
            "name": node.name,
            "op": node.op,
            "args": [_arg(a) for a in node.args],
            "kwargs": {k: _arg(v) for k, v in node.kwargs.items()},
            "meta": _meta(node.meta.get("tensor_meta")),
        }
        if node.op == "call_function":
            entry["target"] = _canonical_function(node.target)
        elif node.op == "call_module":
            entry["target"] = str(node.target)
            entry["module"] = _module_info(graph_module.get_submodule(node.target))
        else:
            entry["target"] = str(node.target)
        if node.op == "get_attr" and node.target in made:
            # a tensor the forward creates from literals (torch.tensor(0.5)): an attribute of the
            # traced module only, so ModelNew gets its value
            value = getattr(graph_module, node.target)  # a top-level name: made holds vars() keys
            if not isinstance(value, torch.Tensor) or value.numel() > MAX_CONSTANT_ELEMENTS:
                return {"error": f"the forward creates a constant {type(value).__name__} too large to write into ModelNew"}
            entry["value"] = _arg(value.tolist())
        nodes.append(entry)
    return {"graph": {"nodes": nodes, "traced_on": traced_on}}


def _warm_up(device: str) -> None:
    import torch.fx  # noqa: F401  (the import is most of a child's start-up: paid before the job arrives)
    from torch.fx.passes.shape_prop import ShapeProp  # noqa: F401  (the same)


def handle(spec: dict[str, Any], workdir: Path, device: str) -> dict[str, Any]:
    try:
        return trace(spec["source"])
    except BaseException as exc:  # the module's own failure is the answer
        return {"error": f"{type(exc).__name__} while tracing: {exc}"[:500]}


if __name__ == "__main__":
    serve(handle, _warm_up, quiet_stdout=True)  # whatever the module prints goes to stderr
