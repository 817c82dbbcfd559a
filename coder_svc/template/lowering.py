"""What each fx node means to the generator: a pointwise op, a reduction, a softmax, a
normalisation, a pool, an alias, or something PyTorch keeps doing (None, or Unsupported with the
reason when the generator knows the op but not this use of it). A reduced loss functional is first
rewritten into its pointwise loss and PyTorch's reduction of it (``decompose_losses``).

Functions, methods and ``torch.nn`` activation modules all map onto one small vocabulary, so the
fusion and code generation never look at fx targets again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from coder_svc.template.graph import Graph, Node, NodeRef, TensorMeta, TupleConst

Operand = str | float | int | bool
"""A node name (a tensor value) or a Python scalar."""

FLOAT_DTYPES = frozenset({"float32", "float16", "bfloat16"})

# name -> parameter names after the input, with defaults; what the Triton emitter needs.
UNARY: dict[str, tuple[tuple[str, Any], ...]] = {
    **{
        name: ()
        for name in (
            "relu",
            "sigmoid",
            "tanh",
            "exp",
            "log",
            "sqrt",
            "rsqrt",
            "abs",
            "neg",
            "negative",
            "silu",
            "mish",
            "selu",
            "hardsigmoid",
            "hardswish",
            "softsign",
            "relu6",
            "logsigmoid",
            "square",
            "reciprocal",
            "erf",
            "sin",
            "cos",
            "log2",
            "exp2",
            "log1p",
            "expm1",
            "floor",
            "ceil",
            "sign",
            "tanhshrink",
        )
    },
    "gelu": (("approximate", "none"),),
    "leaky_relu": (("negative_slope", 0.01),),
    "elu": (("alpha", 1.0),),
    "celu": (("alpha", 1.0),),
    "softplus": (("beta", 1.0), ("threshold", 20.0)),
    "hardtanh": (("min_val", -1.0), ("max_val", 1.0)),
    "threshold": (("threshold", None), ("value", None)),
}
BINARY = {
    "add",
    "sub",
    "mul",
    "div",
    "true_divide",
    "truediv",
    "rsub",
    "maximum",
    "minimum",
    "fmax",
    "fmin",
    "gt",
    "lt",
    "ge",
    "le",
    "eq",
    "ne",
    "pow",
}
ALIASES = {
    "subtract": "sub",
    "multiply": "mul",
    "divide": "div",
    "true_divide": "div",
    "truediv": "div",
    "greater": "gt",
    "less": "lt",
    "greater_equal": "ge",
    "less_equal": "le",
    "not_equal": "ne",
    "negative": "neg",
    "clip": "clamp",
    "swish": "silu",
}
REDUCTIONS = {"sum", "mean", "amax", "amin", "max", "min", "prod", "logsumexp", "norm", "var", "std"}
SOFTMAXES = {"softmax", "log_softmax"}
IDENTITIES = {
    "contiguous",
    "clone",
    "detach",
    "dropout",
    "alpha_dropout",
    "feature_alpha_dropout",
    "dropout1d",
    "dropout2d",
    "dropout3d",
}

# torch.nn modules (only these classes, never a user class of the same name) -> op and attributes.
MODULES: dict[str, tuple[str, tuple[str, ...]]] = {
    "ReLU": ("relu", ()),
    "ReLU6": ("relu6", ()),
    "LeakyReLU": ("leaky_relu", ("negative_slope",)),
    "GELU": ("gelu", ("approximate",)),
    "Sigmoid": ("sigmoid", ()),
    "Tanh": ("tanh", ()),
    "SiLU": ("silu", ()),
    "Mish": ("mish", ()),
    "Softplus": ("softplus", ("beta", "threshold")),
    "ELU": ("elu", ("alpha",)),
    "CELU": ("celu", ("alpha",)),
    "SELU": ("selu", ()),
    "Hardtanh": ("hardtanh", ("min_val", "max_val")),
    "Hardsigmoid": ("hardsigmoid", ()),
    "Hardswish": ("hardswish", ()),
    "Softsign": ("softsign", ()),
    "LogSigmoid": ("logsigmoid", ()),
    "Tanhshrink": ("tanhshrink", ()),
    "Threshold": ("threshold", ("threshold", "value")),
    "Softmax": ("softmax", ("dim",)),
    "LogSoftmax": ("log_softmax", ("dim",)),
    "Identity": ("identity", ()),
    "Dropout": ("identity", ()),
    "Dropout1d": ("identity", ()),
    "Dropout2d": ("identity", ()),
    "Dropout3d": ("identity", ()),
    "AlphaDropout": ("identity", ()),
    "KLDivLoss": ("kl_div", ("reduction", "log_target")),
    "SmoothL1Loss": ("smooth_l1_loss", ("reduction", "beta")),
    "HuberLoss": ("huber_loss", ("reduction", "delta")),
    "MSELoss": ("mse_loss", ("reduction",)),
    "L1Loss": ("l1_loss", ("reduction",)),
}


@dataclass(frozen=True)
class Elementwise:
    fn: str
    operands: tuple[Operand, ...]
    attrs: tuple[tuple[str, Any], ...] = ()

    def attr(self, name: str) -> Any:
        return dict(self.attrs)[name]


@dataclass(frozen=True)
class Reduce:
    kind: str  # sum mean max min prod logsumexp norm1 norm2 var std
    source: str
    dims: tuple[int, int]  # reduced dims are the range [dims[0], dims[1])
    keepdim: bool
    correction: float = 0.0
    tuple_output: bool = False  # torch.max(x, dim) returns (values, indices): only values are generated


@dataclass(frozen=True)
class Softmax:
    kind: str  # softmax or log_softmax
    source: str
    dim: int


@dataclass(frozen=True)
class Alias:
    source: str


@dataclass(frozen=True)
class Norm:
    """A ``torch.nn`` batch, instance or group norm module: statistics per channel (batch norm), per
    sample and channel (instance norm) or per sample and group (group norm), then normalise and
    affine. The launcher reads the module itself at run time (training flag, running statistics,
    weight, bias, eps, momentum), so eval and training mode both follow PyTorch's semantics."""

    kind: str  # batch_norm, instance_norm or group_norm
    source: str
    module: str  # the module's attribute path in the model


@dataclass(frozen=True)
class Pool:
    """Max or average pooling over the last ``dims`` dims (1 to 3), as ``torch.nn.functional``'s
    pools compute it. An adaptive pool (``output_size`` set) has windows and strides of the input's
    size over the output's, computed at run time: it is lowered only when they divide evenly."""

    kind: str  # max_pool or avg_pool
    source: str
    dims: int
    kernel: tuple[int, ...] = ()
    stride: tuple[int, ...] = ()
    padding: tuple[int, ...] = ()
    dilation: tuple[int, ...] = ()
    ceil_mode: bool = False
    count_include_pad: bool = True
    divisor: int | None = None
    output_size: tuple[int | None, ...] | None = None  # adaptive; None keeps the input's size


@dataclass(frozen=True)
class Unsupported:
    """An op the generator knows but not in this form: PyTorch keeps it, and the draft says why."""

    reason: str


Lowered = Elementwise | Reduce | Softmax | Norm | Pool | Alias | Unsupported | None


@dataclass
class _Call:
    """A node as (op name, input, arguments by name), whatever form it was written in."""

    name: str
    positional: list[Any]
    named: dict[str, Any] = field(default_factory=dict)

    def get(self, index: int, key: str, default: Any = None) -> Any:
        if key in self.named:
            return self.named[key]
        return self.positional[index] if index < len(self.positional) else default


def _call_of(node: Node) -> _Call | None:
    if node.op == "call_function":
        for prefix in ("torch.nn.functional.", "torch.special.", "torch.", "operator."):
            if node.target.startswith(prefix) and "." not in node.target[len(prefix) :]:
                name = node.target[len(prefix) :]
                if prefix == "operator." and name == "getitem":
                    return _Call("getitem", list(node.args), dict(node.kwargs))
                return _Call(name, list(node.args), dict(node.kwargs))
        return None
    if node.op == "call_method":
        return _Call(node.target, list(node.args), dict(node.kwargs))
    if node.op == "call_module" and node.module and node.module.cls.startswith("torch.nn.modules."):
        entry = MODULES.get(node.module.cls.rsplit(".", 1)[1])
        if entry is None:
            return None
        name, attr_names = entry
        named = {k: _plain(node.module.attrs[k]) for k in attr_names if k in node.module.attrs}
        return _Call(name, list(node.args), named)
    return None


def _plain(value: Any) -> Any:
    if isinstance(value, TupleConst):
        return [_plain(v) for v in value.tuple]
    return value


def _operand(value: Any) -> Operand | None:
    if isinstance(value, NodeRef):
        return value.node
    if isinstance(value, bool) or isinstance(value, (int, float)):
        return value
    return None


def _scalar(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _dims(value: Any, rank: int) -> tuple[int, int] | None:
    """A dim argument as a contiguous range [d0, d1), or None if it is not one."""
    value = _plain(value)
    if value is None or value == []:
        dims = list(range(rank))
    elif isinstance(value, int) and not isinstance(value, bool):
        dims = [value]
    elif isinstance(value, list) and all(isinstance(d, int) and not isinstance(d, bool) for d in value):
        dims = list(value)
    else:
        return None
    if rank == 0:
        return (0, 0) if all(d in (0, -1) for d in dims) else None
    norm = sorted({d % rank for d in dims if -rank <= d < rank})
    if len(norm) != len(dims) or norm != list(range(norm[0], norm[-1] + 1)):
        return None
    return norm[0], norm[-1] + 1


# torch.nn norm modules -> (kind, the input rank they normalise batched; None: any rank from 2)
NORM_MODULES = {
    "torch.nn.modules.batchnorm.BatchNorm1d": ("batch_norm", None),
    "torch.nn.modules.batchnorm.BatchNorm2d": ("batch_norm", 4),
    "torch.nn.modules.batchnorm.BatchNorm3d": ("batch_norm", 5),
    "torch.nn.modules.instancenorm.InstanceNorm1d": ("instance_norm", 3),
    "torch.nn.modules.instancenorm.InstanceNorm2d": ("instance_norm", 4),
    "torch.nn.modules.instancenorm.InstanceNorm3d": ("instance_norm", 5),
    "torch.nn.modules.normalization.GroupNorm": ("group_norm", None),
}


def _norm(node: Node, graph: dict[str, Node]) -> Norm | None:
    assert node.module is not None
    kind, rank = NORM_MODULES[node.module.cls]
    source = node.args[0] if len(node.args) == 1 and not node.kwargs else None
    src = graph.get(source.node) if isinstance(source, NodeRef) else None
    meta = src.tensor if src is not None else None
    # fp32 only: a half input with fp32 statistics and parameters is a mixed-precision path PyTorch owns
    if not isinstance(source, NodeRef) or meta is None or meta.dtype != "float32" or len(meta.shape) < 2:
        return None
    batch_norm_1d = kind == "batch_norm" and rank is None
    if (rank is not None and len(meta.shape) != rank) or (batch_norm_1d and len(meta.shape) > 3):
        return None  # BatchNorm1d takes (N, C) and (N, C, L); an unbatched instance norm's input is (C, ...)
    if kind == "instance_norm" and node.module.attrs.get("track_running_stats") is not False:
        return None  # an instance norm's running statistics (averaged over the batch) are left to PyTorch
    return Norm(kind, source.node, node.target)


# pooling functions (torch.nn.functional's and torch's) -> their parameters after the input, with defaults
POOL_FUNCTION = re.compile(r"(max_pool|avg_pool|adaptive_avg_pool|adaptive_max_pool)([123])d(_with_indices)?")
POOL_PARAMS: dict[str, tuple[tuple[str, Any], ...]] = {
    "max_pool": (
        ("kernel_size", None),
        ("stride", None),
        ("padding", 0),
        ("dilation", 1),
        ("ceil_mode", False),
        ("return_indices", False),
    ),
    "avg_pool": (
        ("kernel_size", None),
        ("stride", None),
        ("padding", 0),
        ("ceil_mode", False),
        ("count_include_pad", True),
        ("divisor_override", None),
    ),
    "adaptive_avg_pool": (("output_size", None),),
    "adaptive_max_pool": (("output_size", None), ("return_indices", False)),
}
# torch.nn pooling modules -> (their function's family, pooled dims); they hold the same parameters
POOL_MODULES = {
    f"torch.nn.modules.pooling.{cls}{dims}d": (family, dims)
    for family, cls in (
        ("max_pool", "MaxPool"),
        ("avg_pool", "AvgPool"),
        ("adaptive_avg_pool", "AdaptiveAvgPool"),
        ("adaptive_max_pool", "AdaptiveMaxPool"),
    )
    for dims in (1, 2, 3)
}


def _pool_module(node: Node, graph: dict[str, Node]) -> Pool | Reduce | Unsupported | None:
    assert node.module is not None
    family, dims = POOL_MODULES[node.module.cls]
    attrs = node.module.attrs
    # every parameter must have been read: a default standing in for an unreadable one would be wrong
    missing = [key for key, _ in POOL_PARAMS[family] if key not in attrs and key != "divisor_override"]
    if missing:
        return Unsupported(f"its {missing[0]} is not a constant the trace could read")
    if len(node.args) != 1 or node.kwargs:
        return None
    named = {key: attrs[key] for key, _ in POOL_PARAMS[family] if key in attrs}
    return _pool(family, dims, _Call(family, list(node.args), named), node, graph)


def _sizes(value: Any, dims: int, none_ok: bool = False) -> tuple[Any, ...] | None:
    """A pool's per-dim parameter (one int for all dims, or one per dim) as a tuple of ``dims``."""
    value = _plain(value)
    items = value if isinstance(value, list) else [value]
    if len(items) not in (1, dims) or not all(
        (isinstance(v, int) and not isinstance(v, bool)) or (none_ok and v is None) for v in items
    ):
        return None
    return tuple(items * dims if len(items) == 1 else items)


def _pool(family: str, dims: int, call: _Call, node: Node, graph: dict[str, Node]) -> Pool | Reduce | Unsupported | None:
    source = call.positional[0]
    src = graph.get(source.node) if isinstance(source, NodeRef) else None
    if src is None or src.tensor is None or not isinstance(source, NodeRef):
        return None
    if node.tensor is None:  # a (values, indices) pair
        return Unsupported("it returns the indices of its maxima, which the generator does not compute")
    rank = len(src.tensor.shape)
    if rank not in (dims + 1, dims + 2):
        return Unsupported(f"a {dims}d pool of a {rank}d input")
    p = {key: _plain(call.get(i + 1, key, default)) for i, (key, default) in enumerate(POOL_PARAMS[family])}
    if family.startswith("adaptive"):
        size = _sizes(p["output_size"], dims, none_ok=True)
        if size is None:
            return Unsupported("its output_size is not a constant")
        spatial = src.tensor.shape[rank - dims :]
        out = [x if o is None else o for x, o in zip(spatial, size)]
        if any(o < 1 or x % o for x, o in zip(spatial, out)):
            return Unsupported(f"adaptive windows of unequal sizes ({tuple(spatial)} pooled to {tuple(out)})")
        if family == "adaptive_avg_pool" and all(o == 1 for o in size):  # a global average is a mean
            return Reduce("mean", source.node, (rank - dims, rank), keepdim=True)
        return Pool(family.removeprefix("adaptive_"), source.node, dims, output_size=size)
    kernel = _sizes(p["kernel_size"], dims)
    stride = kernel if p["stride"] in (None, []) else _sizes(p["stride"], dims)
    padding = _sizes(p["padding"], dims)
    dilation = _sizes(p.get("dilation", 1), dims)
    flags = [p["ceil_mode"], p.get("count_include_pad", True)]
    divisor = p.get("divisor_override")
    if kernel is None or stride is None or padding is None or dilation is None or not all(isinstance(f, bool) for f in flags):
        return Unsupported("its kernel_size, stride, padding, dilation or mode is not a constant")
    if min(kernel + stride + dilation) < 1 or min(padding) < 0 or any(2 * q > k for q, k in zip(padding, kernel)):
        return Unsupported("its window parameters are out of range (PyTorch rejects them too)")
    if divisor is not None and not (isinstance(divisor, int) and not isinstance(divisor, bool) and divisor > 0):
        return Unsupported("its divisor_override is not a positive int")
    return Pool(family, source.node, dims, kernel, stride, padding, dilation, flags[0], flags[1], divisor)


# loss functionals (torch.nn.functional's) -> their parameters after (input, target), with defaults
LOSSES: dict[str, tuple[tuple[str, Any], ...]] = {
    "kl_div": (("size_average", None), ("reduce", None), ("reduction", "mean"), ("log_target", False)),
    "smooth_l1_loss": (("size_average", None), ("reduce", None), ("reduction", "mean"), ("beta", 1.0)),
    "huber_loss": (("reduction", "mean"), ("delta", 1.0), ("weight", None)),
    "mse_loss": (("size_average", None), ("reduce", None), ("reduction", "mean"), ("weight", None)),
    "l1_loss": (("size_average", None), ("reduce", None), ("reduction", "mean"), ("weight", None)),
}


@dataclass(frozen=True)
class Loss:
    """A loss functional as PyTorch computes it: a pointwise loss over (input, target), then its reduction."""

    pointwise: Elementwise
    reduction: str  # none, sum, mean or batchmean (kl_div's: the sum over input.size(0))


def loss_of(node: Node, graph: dict[str, Node]) -> Loss | Unsupported | None:
    """A loss functional or module node as a Loss, Unsupported with the reason, or None if it is no loss."""
    call = _call_of(node)
    if call is None or call.name not in LOSSES or node.op == "call_method":
        return None
    if node.op == "call_function" and not node.target.startswith("torch.nn.functional."):
        return None  # torch.kl_div and friends take ATen's integer reduction enum
    if node.op == "call_module":
        assert node.module is not None
        missing = [key for key in MODULES[node.module.cls.rsplit(".", 1)[1]][1] if key not in node.module.attrs]
        if missing:  # a default standing in for an unreadable parameter would be wrong
            return Unsupported(f"its {missing[0]} is not a constant the trace could read")
    p = {key: _plain(call.get(i + 2, key, default)) for i, (key, default) in enumerate(LOSSES[call.name])}
    if p.get("size_average") is not None or p.get("reduce") is not None:
        return Unsupported("it uses the deprecated size_average or reduce arguments")
    if p.get("weight") is not None:
        return Unsupported("it weighs the elements (weight), which the generator does not")
    allowed = ("none", "mean", "sum", "batchmean") if call.name == "kl_div" else ("none", "mean", "sum")
    if p["reduction"] not in allowed:
        return Unsupported(f"reduction={p['reduction']!r} is not one of {', '.join(allowed)}")
    operands = [call.positional[0], call.get(1, "target")]
    metas = [graph[o.node].tensor if isinstance(o, NodeRef) and o.node in graph else None for o in operands]
    if any(m is None for m in metas):
        return None
    x, t = (o.node for o in operands)
    shapes = [tuple(m.shape) for m in metas if m is not None]
    if any(m.dtype not in FLOAT_DTYPES for m in metas if m is not None):
        return Unsupported("its input and target are not both float32, float16 or bfloat16 tensors")
    if shapes[0] != shapes[1]:
        return Unsupported(
            f"its input {shapes[0]} and target {shapes[1]} differ in shape: "
            "PyTorch broadcasts them (with a warning), the generator does not"
        )
    fn = call.name
    attrs: tuple[tuple[str, Any], ...] = ()
    if fn == "kl_div":
        if not isinstance(p["log_target"], bool):
            return Unsupported("its log_target is not a constant bool")
        attrs = (("log_target", p["log_target"]),)
    elif fn in ("smooth_l1_loss", "huber_loss"):
        key = "beta" if fn == "smooth_l1_loss" else "delta"
        value = p[key]
        if not _scalar(value) or value < 0 or (value == 0 and key == "delta"):  # PyTorch rejects these too
            return Unsupported(f"its {key} is not a constant {'>= 0' if key == 'beta' else '> 0'}")
        if value == 0:  # PyTorch's own smooth_l1_loss with beta=0 is l1_loss
            fn = "l1_loss"
        else:
            attrs = ((key, float(value)),)
    return Loss(Elementwise(fn, (x, t), attrs), p["reduction"])


def decompose_losses(graph: Graph) -> Graph:
    """Each reduced loss becomes what PyTorch computes: its pointwise loss (``reduction='none'``), then
    ``torch.sum`` or ``torch.mean`` of it; batchmean (the sum over input.size(0), the plain sum of a 0-d
    input) the mean of its per-sample sums, so the divisor is the run-time batch size. Each new node is
    a real PyTorch call under a fresh name, the last one under the loss's own, so any of them left to
    PyTorch is still written correctly."""
    nodes = graph.by_name()
    taken = set(nodes)

    def fresh(base: str) -> str:
        while base in taken:
            base += "_"
        taken.add(base)
        return base

    out: list[Node] = []
    for node in graph.nodes:
        loss = loss_of(node, nodes)
        if not isinstance(loss, Loss) or loss.reduction == "none" or node.tensor is None:
            out.append(node)
            continue
        x, t = loss.pointwise.operands
        meta = nodes[str(x)].tensor
        assert meta is not None, "loss_of lowers only tensors with a traced shape"
        shape, dtype = list(meta.shape), node.tensor.dtype
        rank = len(shape)
        steps: list[tuple[str, list[int] | None]] = [(loss.reduction, None)]
        if loss.reduction == "batchmean":  # a 1-d input's is its mean, a 0-d one's its sum
            per_sample = [("sum", list(range(1, rank)))] if rank > 1 else []
            steps = [("sum", None)] if rank == 0 else [*per_sample, ("mean", None)]
        source = Node(
            name=fresh(f"{node.name}_pointwise"),
            op="call_function",
            target=f"torch.nn.functional.{loss.pointwise.fn}",
            args=[NodeRef(node=str(x)), NodeRef(node=str(t))],
            kwargs={"reduction": "none", **dict(loss.pointwise.attrs)},
            meta=TensorMeta(shape=shape, dtype=dtype),
        )
        out.append(source)
        for k, (kind, dims) in enumerate(steps):
            last = k == len(steps) - 1
            out.append(
                Node(
                    name=node.name if last else fresh(f"{node.name}_rows"),
                    op="call_function",
                    target=f"torch.{kind}",
                    args=[NodeRef(node=out[-1].name)],
                    kwargs={} if dims is None else {"dim": dims},
                    meta=node.tensor if last else TensorMeta(shape=shape[:1], dtype=dtype),
                )
            )
    return Graph(nodes=out, traced_on=graph.traced_on)


def lower(node: Node, graph: dict[str, Node]) -> Lowered:
    if node.op == "call_module" and node.module and node.module.cls in NORM_MODULES:
        return _norm(node, graph)
    if node.op == "call_module" and node.module and node.module.cls in POOL_MODULES:
        return _pool_module(node, graph)
    call = _call_of(node)
    if call is None or not call.positional:
        return None
    # In-place forms (relu_, add_) compute the same values; fusion refuses them where the mutation is observed.
    name = call.name[:-1] if call.name.endswith("_") and not call.name.startswith("_") else call.name
    name = ALIASES.get(name, name)
    source = call.positional[0]
    if name == "getitem":
        src = graph.get(source.node) if isinstance(source, NodeRef) else None
        lowered = lower(src, graph) if src is not None and call.get(1, "index") == 0 else None
        if isinstance(lowered, Reduce) and isinstance(source, NodeRef):
            return Alias(source.node) if lowered.tuple_output else None
        return None
    if name == "identity" or name in IDENTITIES:
        if name.startswith(("dropout", "alpha", "feature")) and call.get(2, "training", call.named.get("train", True)):
            return None  # dropout in training mode really drops: not an identity
        return Alias(source.node) if isinstance(source, NodeRef) else None
    if name in ("float", "to", "type") and isinstance(source, NodeRef):
        src = graph.get(source.node)
        if (
            src is not None
            and src.tensor
            and node.tensor
            and src.tensor.dtype == node.tensor.dtype
            and src.tensor.shape == node.tensor.shape
        ):
            return Alias(source.node)
        return None
    if name in UNARY:
        operand = _operand(source)
        if not isinstance(operand, str):
            return None
        attrs = tuple((key, _plain(call.get(i + 1, key, default))) for i, (key, default) in enumerate(UNARY[name]))
        if any(not (_scalar(v) or isinstance(v, str) or v is None) for _, v in attrs):
            return None
        if name == "gelu" and dict(attrs)["approximate"] not in ("none", "tanh"):
            return None
        if name == "threshold" and not all(_scalar(v) for _, v in attrs):
            return None
        return Elementwise(name, (operand,), attrs)
    if name in ("clamp", "clamp_min", "clamp_max"):
        lo = call.get(1, "min") if name in ("clamp", "clamp_min") else None
        hi = call.get(2, "max") if name == "clamp" else call.get(1, "max") if name == "clamp_max" else None
        found = [_operand(v) for v in (lo, hi) if v is not None]
        bounds = [b for b in found if b is not None]
        x = _operand(source)
        if not isinstance(x, str) or not bounds or len(bounds) != len(found):
            return None
        return Elementwise("clamp", (x, *bounds), (("has_min", lo is not None), ("has_max", hi is not None)))
    if name == "where":
        given = [_operand(call.get(i, key)) for i, key in enumerate(("condition", "input", "other"))]
        operands = tuple(o for o in given if o is not None)
        if len(operands) != len(given) or not isinstance(operands[0], str):
            return None
        return Elementwise("where", operands)
    if name in ("max", "min") and (isinstance(call.get(1, "other"), NodeRef)):
        return _binary("maximum" if name == "max" else "minimum", call)
    if name in BINARY:
        return _binary(name, call)
    if name in REDUCTIONS:
        return _reduction(name, call, node, graph)
    if name in LOSSES:  # a reduced loss was decomposed (decompose_losses): its pointwise part is lowered here
        loss = loss_of(node, graph)
        if isinstance(loss, Loss):
            return loss.pointwise if loss.reduction == "none" else None
        return loss
    pool = POOL_FUNCTION.fullmatch(name)
    if pool:
        return _pool(pool[1], int(pool[2]), call, node, graph)
    if name in SOFTMAXES:
        if not isinstance(source, NodeRef) or call.get(2, "dtype") is not None or call.get(1, "dim") is None:
            return None
        src = graph.get(source.node)
        rank = len(src.tensor.shape) if src is not None and src.tensor else None
        dim = call.get(1, "dim")
        if rank is None or not isinstance(dim, int) or not -max(rank, 1) <= dim < max(rank, 1):
            return None
        return Softmax(name, source.node, dim % max(rank, 1))
    return None


def _binary(name: str, call: _Call) -> Elementwise | None:
    a, b = _operand(call.positional[0]), _operand(call.get(1, "other", call.get(1, "exponent")))
    if a is None or b is None or not (isinstance(a, str) or isinstance(b, str)):
        return None
    alpha = call.named.get("alpha", 1)
    if call.named.get("rounding_mode") is not None or not _scalar(alpha):
        return None
    name = ALIASES.get(name, name)
    if name in ("add", "sub", "rsub") and alpha != 1:
        return Elementwise(name, (a, b), (("alpha", alpha),))
    return Elementwise(name, (a, b))


def _reduction(name: str, call: _Call, node: Node, graph: dict[str, Node]) -> Reduce | None:
    source = call.positional[0]
    src = graph.get(source.node) if isinstance(source, NodeRef) else None
    if src is None or src.tensor is None or src.tensor.dtype not in FLOAT_DTYPES:
        return None
    rank = len(src.tensor.shape)
    tuple_output = False
    correction = 0.0
    if name == "norm":
        p = call.get(1, "p", "fro")
        if p in ("fro", 2, 2.0):
            kind = "norm2"
        elif p in (1, 1.0):
            kind = "norm1"
        else:
            return None
        dim, keepdim = call.get(2, "dim"), call.get(3, "keepdim", False)
        if call.get(4, "out") is not None or call.get(5, "dtype") is not None:
            return None
    else:
        dim, keepdim = call.get(1, "dim"), call.get(2, "keepdim", False)
        kind = {"amax": "max", "amin": "min"}.get(name, name)
        if name in ("max", "min"):
            tuple_output = dim is not None
            if tuple_output and not isinstance(dim, int):
                return None
        if name in ("var", "std"):
            unbiased = call.named.get("unbiased", True)
            correction = call.named.get("correction", 1 if unbiased else 0)
            if not _scalar(correction):
                return None
        elif name in ("sum", "mean", "prod") and call.named.get("dtype") is not None:
            return None
        if name == "logsumexp" and dim is None:
            return None
    if not isinstance(keepdim, bool):
        return None
    dims = _dims(dim, rank)
    if dims is None or dims[0] == dims[1] and rank > 0:
        return None
    return Reduce(kind, source.node, dims, keepdim, float(correction), tuple_output)
