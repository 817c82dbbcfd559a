"""The API catalog: the Torch operations a proposed module may use, and what composing each needs.

Every entry is keyed by its canonical name (see ``proposer_svc.stats``) and says which ranks and
dtypes its main input accepts, how it samples its arguments for a given input, how the input
shape maps to the output shape, and how it is written: ``layer`` is the ``__init__`` expression of
an ``nn`` layer (kept as ``self.<attr>``), ``call`` the ``forward`` expression. Templates use
``{x}`` for the main input, ``{y}`` for the second operand, ``{m}`` for the layer attribute and
``{<arg>}`` for sampled arguments; arguments named in ``init_args`` become module-level constants
passed through ``get_init_inputs`` (the KernelBench convention), the others are written literally.

Beyond shapes, an entry describes what it does to values, so the composer can keep outputs finite
and non-trivial: the value domain it needs and yields, rough magnitude, whether it saturates
(relu's floor makes a later ``min`` constant), which dims it normalises (a later ``sum`` over a
softmax dim is constant 1), and whether it mixes or is affine.

Left out on purpose: random ops (dropout, ``rand_like``: outputs not reproducible), identity-like
ops (``nn.Identity``, ``contiguous``, ``clone``, ``detach``), in-place variants, rounding and
``sign`` (piecewise-constant: outputs degenerate to constants on typical inputs), and integer-input
layers (``nn.Embedding``) that cannot follow a float chain.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from random import Random
from typing import Any, Literal

Shape = tuple[int, ...]
Args = dict[str, Any]
Domain = Literal["any", "nonneg", "nonpos", "pos", "unit", "bounded", "open"]
Effect = Literal["nonlinear", "affine", "mix", "shape", "normalize", "reduce", "terminal"]
Reduces = Literal["sum", "min", "max", "prod"]
Kind = Literal[
    "pointwise",
    "activation",
    "binary",
    "reduction",
    "scan",
    "softmax",
    "norm",
    "linear",
    "conv",
    "pool",
    "resize",
    "shape",
    "loss",
    "index",
]


@dataclass(frozen=True)
class Operand:
    """What the composer knows about a tensor flowing through ``forward``."""

    shape: Shape
    dtype: str = "float32"
    domain: Domain = "any"
    mag: float = 1.0  # rough RMS of its values
    saturated: frozenset[str] = frozenset()  # "low"/"high": many values sit exactly at a bound
    normalized: frozenset[int] = frozenset()  # dims whose sum/mean/norm is fixed by a normalisation
    contiguous: bool = True  # False after transpose/permute (and pointwise ops keep their strides): no .view

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


Sampler = Callable[[Operand, Random, float], "Args | None"]
ShapeFn = Callable[[Shape, Args], Shape]


@dataclass(frozen=True)
class SecondOperand:
    """The other tensor of a binary op: a new forward input, or a parameter the module owns."""

    shape: ShapeFn  # its shape, given the main input's shape and the sampled args
    sources: tuple[Literal["input", "param"], ...] = ("input", "param")
    make: str = "torch.randn({shape})"  # how get_inputs (or the parameter) creates it
    dtype: str = "float32"
    broadcast: ShapeFn | None = None  # a smaller broadcastable shape a parameter may take


@dataclass(frozen=True)
class ApiEntry:
    name: str
    kind: Kind
    ranks: tuple[int, ...]  # accepted ranks of the main input
    call: str
    sample: Sampler = lambda op, rng, d: {}
    out_shape: ShapeFn = lambda shape, args: shape
    layer: str | None = None
    attr: str = "layer"
    init_args: tuple[str, ...] = ()
    second: SecondOperand | None = None
    dtypes: tuple[str, ...] = ("float32",)
    out_dtype: str = "float32"
    requires: Domain = "any"
    small_input: bool = False  # needs |x| of order 1 (exp, cosh, pow...): the composer rescales (products: up too)
    yields: Domain | Literal["same", "flip"] = "any"
    effect: Effect = "nonlinear"
    saturates: frozenset[str] = frozenset()
    mag: Callable[[float, Shape, Args], float] = lambda m, shape, args: m
    flops: Callable[[Shape, Args], float] = lambda shape, args: float(math.prod(shape))
    normalizes: Callable[[Shape, Args], frozenset[int]] | None = None  # dims it normalises over
    reduces: Reduces | None = None  # what a reduction computes
    has_bias: bool = False  # layer template takes {bias}; the bias is a shift a later norm cancels

    @property
    def namespace(self) -> str:
        return self.name.rsplit(".", 1)[0]


# --- shape helpers -----------------------------------------------------------------------------


def _same(shape: Shape, args: Args) -> Shape:
    return shape


def _dims(args: Args) -> tuple[int, ...]:
    dim = args["dim"]
    return tuple(dim) if isinstance(dim, (tuple, list)) else (dim,)


def _reduced(shape: Shape, args: Args) -> Shape:
    dims = {d % len(shape) for d in _dims(args)}
    if args.get("keepdim"):
        return tuple(1 if i in dims else s for i, s in enumerate(shape))
    return tuple(s for i, s in enumerate(shape) if i not in dims)


def _feature_dim(op: Operand, rng: Random, avoid: frozenset[int] = frozenset()) -> int | None:
    """A non-batch dim to work along (not one a normalisation has fixed), or None."""
    dims = [d for d in range(1, op.rank) if d not in avoid and op.shape[d] > 1]
    return rng.choice(dims) if dims else None


def _pick(rng: Random, options: list[int], difficulty: float) -> int:
    """An option, larger ones likelier as difficulty grows."""
    index = min(len(options) - 1, max(0, round(difficulty * (len(options) - 1) + rng.uniform(-1, 1))))
    return options[index]


# --- families ----------------------------------------------------------------------------------

ENTRIES: list[ApiEntry] = []
ALL_RANKS = (1, 2, 3, 4, 5)


def _add(entry: ApiEntry) -> None:
    ENTRIES.append(entry)


def _pointwise(names: tuple[str, ...], call: str, kind: Kind = "pointwise", **kw: Any) -> None:
    """One op under several canonical names: ``torch.f``, ``Tensor.f``, ``torch.nn.functional.f``.

    ``call`` is written for ``torch.<f>``; the other namespaces derive their own spelling.
    """
    for name in names:
        namespace, fn = name.rsplit(".", 1)
        if namespace == "Tensor":
            text = call.replace(f"torch.{fn}({{x}}, ", f"{{x}}.{fn}(").replace(f"torch.{fn}({{x}})", f"{{x}}.{fn}()")
        elif namespace == "torch.nn.functional":
            text = call.replace(f"torch.{fn}(", f"F.{fn}(")
        else:
            text = call
        _add(ApiEntry(name, kind, ALL_RANKS, text, **kw))


def _layer_activation(layer_name: str, ctor: str, **kw: Any) -> None:
    _add(ApiEntry(f"torch.nn.{layer_name}", "activation", ALL_RANKS, "self.{m}({x})", layer=ctor, attr="act", **kw))


def _mag_exp(m: float, shape: Shape, args: Args) -> float:
    return math.exp(min(m, 20.0))


def _mag_sq(m: float, shape: Shape, args: Args) -> float:
    return m * m


def _mag_one(m: float, shape: Shape, args: Args) -> float:
    return 1.0


def _mag_shrink(m: float, shape: Shape, args: Args) -> float:
    return min(m, 1.0)


# Elementwise math.
_pointwise(("torch.abs", "Tensor.abs"), "torch.abs({x})", yields="nonneg", effect="nonlinear")
_pointwise(("torch.neg", "Tensor.neg"), "torch.neg({x})", yields="flip", effect="affine")
_pointwise(("torch.exp", "Tensor.exp"), "torch.exp({x})", small_input=True, yields="pos", mag=_mag_exp)
_pointwise(("torch.exp2",), "torch.exp2({x})", small_input=True, yields="pos", mag=_mag_exp)
_pointwise(("torch.expm1",), "torch.expm1({x})", small_input=True, mag=_mag_exp)
_pointwise(("torch.log", "Tensor.log"), "torch.log({x})", requires="pos", mag=lambda m, s, a: 3.0)
_pointwise(("torch.log2",), "torch.log2({x})", requires="pos", mag=lambda m, s, a: 4.0)
_pointwise(("torch.log10",), "torch.log10({x})", requires="pos", mag=lambda m, s, a: 1.5)
_pointwise(("torch.log1p",), "torch.log1p({x})", requires="nonneg", yields="nonneg", mag=_mag_one)
_pointwise(("torch.sqrt", "Tensor.sqrt"), "torch.sqrt({x})", requires="nonneg", yields="nonneg", mag=lambda m, s, a: math.sqrt(m))
# Near-zero inputs make these large: a pessimistic magnitude makes later exp-like ops rescale first.
_pointwise(("torch.rsqrt",), "torch.rsqrt({x})", requires="pos", yields="pos", mag=lambda m, s, a: 10.0)
_pointwise(("torch.reciprocal",), "torch.reciprocal({x})", requires="pos", yields="pos", mag=lambda m, s, a: 30.0)
_pointwise(("torch.square",), "torch.square({x})", yields="nonneg", mag=_mag_sq)
_pointwise(
    ("torch.pow", "Tensor.pow"),
    "torch.pow({x}, {exponent})",
    small_input=True,
    sample=lambda op, rng, d: {"exponent": rng.choice([2, 3])},
    mag=lambda m, s, a: m ** a["exponent"],
)
_pointwise(("torch.sin",), "torch.sin({x})", yields="bounded", mag=_mag_shrink)
_pointwise(("torch.cos",), "torch.cos({x})", yields="bounded", mag=_mag_shrink)
_pointwise(("torch.atan",), "torch.atan({x})", mag=_mag_shrink)
_pointwise(("torch.asin",), "torch.asin({x})", requires="open", mag=_mag_shrink)
_pointwise(("torch.acos",), "torch.acos({x})", requires="open", yields="pos", mag=_mag_one)
_pointwise(("torch.atanh",), "torch.atanh({x})", requires="open", mag=_mag_one)
_pointwise(("torch.sinh",), "torch.sinh({x})", small_input=True, mag=_mag_exp)
_pointwise(("torch.cosh",), "torch.cosh({x})", small_input=True, yields="pos", mag=_mag_exp)
_pointwise(("torch.erf",), "torch.erf({x})", yields="bounded", mag=_mag_shrink)
_pointwise(("torch.erfc",), "torch.erfc({x})", yields="nonneg", mag=_mag_one)
_pointwise(
    ("torch.clamp", "Tensor.clamp"),
    "torch.clamp({x}, min={lo}, max={hi})",
    # Bounds between one and two RMS: most values pass, so the output is never all at a bound.
    sample=lambda op, rng, d: {"lo": -round(op.mag * rng.uniform(1.0, 2.0), 2), "hi": round(op.mag * rng.uniform(1.0, 2.0), 2)},
    saturates=frozenset({"low", "high"}),
    mag=_mag_shrink,
)
# Activations.
_pointwise(
    ("torch.relu", "torch.nn.functional.relu", "Tensor.relu"),
    "torch.relu({x})",
    "activation",
    yields="nonneg",
    saturates=frozenset({"low"}),
)
_pointwise(("torch.sigmoid", "Tensor.sigmoid"), "torch.sigmoid({x})", "activation", yields="unit", mag=_mag_shrink)
_pointwise(
    ("torch.tanh", "Tensor.tanh", "torch.nn.functional.tanh"), "torch.tanh({x})", "activation", yields="open", mag=_mag_shrink
)
_pointwise(("torch.nn.functional.relu6",), "torch.relu6({x})", "activation", yields="nonneg", saturates=frozenset({"low"}))
_pointwise(
    ("torch.nn.functional.leaky_relu",),
    "torch.leaky_relu({x}, negative_slope={slope})",
    "activation",
    sample=lambda op, rng, d: {"slope": rng.choice([0.01, 0.1, 0.2])},
)
_pointwise(
    ("torch.nn.functional.elu",),
    "torch.elu({x}, alpha={alpha})",
    "activation",
    sample=lambda op, rng, d: {"alpha": rng.choice([0.5, 1.0])},
)
_pointwise(("torch.nn.functional.selu",), "torch.selu({x})", "activation")
_pointwise(("torch.nn.functional.celu",), "torch.celu({x})", "activation")
_pointwise(("torch.nn.functional.gelu",), "torch.gelu({x})", "activation")
_pointwise(("torch.nn.functional.silu",), "torch.silu({x})", "activation")
_pointwise(("torch.nn.functional.mish",), "torch.mish({x})", "activation")
_pointwise(("torch.nn.functional.softplus",), "torch.softplus({x})", "activation", yields="pos")
_pointwise(("torch.nn.functional.softsign",), "torch.softsign({x})", "activation", yields="open", mag=_mag_shrink)
_pointwise(
    ("torch.nn.functional.hardtanh",),
    "torch.hardtanh({x})",
    "activation",
    yields="bounded",
    saturates=frozenset({"low", "high"}),
    mag=_mag_shrink,
)
_pointwise(
    ("torch.nn.functional.hardsigmoid",),
    "torch.hardsigmoid({x})",
    "activation",
    yields="nonneg",
    saturates=frozenset({"low", "high"}),
    mag=_mag_shrink,
)
_pointwise(("torch.nn.functional.hardswish",), "torch.hardswish({x})", "activation")
_pointwise(("torch.nn.functional.logsigmoid",), "torch.logsigmoid({x})", "activation", yields="nonpos")
_pointwise(("torch.nn.functional.tanhshrink",), "torch.tanhshrink({x})", "activation")
_pointwise(
    ("torch.nn.functional.softshrink",),
    "torch.softshrink({x}, {lambd})",
    "activation",
    sample=lambda op, rng, d: {"lambd": round(op.mag * 0.5, 2)},
)
_pointwise(
    ("torch.nn.functional.hardshrink",),
    "torch.hardshrink({x}, {lambd})",
    "activation",
    sample=lambda op, rng, d: {"lambd": round(op.mag * 0.5, 2)},
)
_layer_activation("ReLU", "nn.ReLU()", yields="nonneg", saturates=frozenset({"low"}))
_layer_activation("GELU", "nn.GELU()")
_layer_activation("SiLU", "nn.SiLU()")
_layer_activation("Tanh", "nn.Tanh()", yields="open", mag=_mag_shrink)
_layer_activation("Sigmoid", "nn.Sigmoid()", yields="unit", mag=_mag_shrink)
_layer_activation(
    "LeakyReLU", "nn.LeakyReLU(negative_slope={slope})", sample=lambda op, rng, d: {"slope": rng.choice([0.01, 0.1, 0.2])}
)
_layer_activation("ELU", "nn.ELU()")
_layer_activation("Softplus", "nn.Softplus()", yields="pos")
_layer_activation("Mish", "nn.Mish()")
_layer_activation("Hardswish", "nn.Hardswish()")
_layer_activation("Hardtanh", "nn.Hardtanh()", yields="bounded", saturates=frozenset({"low", "high"}), mag=_mag_shrink)
# PReLU has a learnable slope per channel: only negative inputs reach it.
_add(
    ApiEntry(
        "torch.nn.PReLU",
        "activation",
        (2, 3, 4, 5),
        "self.{m}({x})",
        layer="nn.PReLU({num_parameters})",
        attr="prelu",
        init_args=("num_parameters",),
        sample=lambda op, rng, d: None if op.domain in ("nonneg", "pos", "unit") else {"num_parameters": op.shape[1]},
    )
)

# Binary elementwise ops: with a second forward input or a parameter.
_ELEMENTWISE_SECOND = SecondOperand(shape=lambda s, a: s, broadcast=lambda s, a: (s[1],) + (1,) * (len(s) - 2))
_POSITIVE_SECOND = SecondOperand(
    shape=lambda s, a: s, broadcast=lambda s, a: (s[1],) + (1,) * (len(s) - 2), make="torch.rand({shape}) + 0.5"
)


def _mag_add(m: float, shape: Shape, args: Args) -> float:
    return math.hypot(m, 1.0)


_BINARY: tuple[tuple[tuple[str, ...], str, SecondOperand, Callable[[float, Shape, Args], float], Effect], ...] = (
    (("torch.add",), "{x} + {y}", _ELEMENTWISE_SECOND, _mag_add, "affine"),
    (("torch.sub",), "{x} - {y}", _ELEMENTWISE_SECOND, _mag_add, "affine"),
    (("torch.mul",), "{x} * {y}", _ELEMENTWISE_SECOND, lambda m, s, a: m, "nonlinear"),
    (("torch.div",), "{x} / {y}", _POSITIVE_SECOND, lambda m, s, a: 2 * m, "nonlinear"),
    (("torch.maximum",), "torch.maximum({x}, {y})", _ELEMENTWISE_SECOND, _mag_add, "nonlinear"),
    (("torch.minimum",), "torch.minimum({x}, {y})", _ELEMENTWISE_SECOND, _mag_add, "nonlinear"),
    (("torch.atan2",), "torch.atan2({x}, {y})", _ELEMENTWISE_SECOND, _mag_one, "nonlinear"),
    (("torch.hypot",), "torch.hypot({x}, {y})", _ELEMENTWISE_SECOND, _mag_add, "nonlinear"),
)
for _names, _call, _second, _mag, _effect in _BINARY:
    for _name in _names:
        _add(
            ApiEntry(
                _name,
                "binary",
                (1, 2, 3, 4, 5),
                _call,
                second=_second,
                mag=_mag,
                effect=_effect,
                yields="nonneg" if _name == "torch.hypot" else "any",
            )
        )
_add(ApiEntry("torch.where", "binary", ALL_RANKS, "torch.where({x} > {y}, {x}, {y})", second=_ELEMENTWISE_SECOND, mag=_mag_add))
_add(
    ApiEntry(
        "torch.lerp",
        "binary",
        ALL_RANKS,
        "torch.lerp({x}, {y}, {weight})",
        second=_ELEMENTWISE_SECOND,
        sample=lambda op, rng, d: {"weight": rng.choice([0.25, 0.5, 0.75])},
        mag=_mag_add,
        effect="affine",
    )
)
_add(
    ApiEntry(
        "torch.cat",
        "shape",
        (1, 2, 3, 4, 5),
        "torch.cat([{x}, {y}], dim={dim})",
        second=SecondOperand(shape=lambda s, a: s, sources=("input",)),
        sample=lambda op, rng, d: None if (dim := _feature_dim(op, rng)) is None else {"dim": dim},
        out_shape=lambda s, a: tuple(2 * n if i == a["dim"] else n for i, n in enumerate(s)),
        mag=_mag_add,
        effect="affine",
    )
)
_add(
    ApiEntry(
        "torch.stack",
        "shape",
        (1, 2, 3, 4),
        "torch.stack([{x}, {y}], dim={dim})",
        second=SecondOperand(shape=lambda s, a: s, sources=("input",)),
        sample=lambda op, rng, d: {"dim": rng.randint(1, op.rank)},
        out_shape=lambda s, a: s[: a["dim"]] + (2,) + s[a["dim"] :],
        mag=_mag_add,
        effect="affine",
    )
)


# Reductions over one non-batch dim (the batch dim is kept so the output is not one number).
def _reduction_sampler(kind: str, keepdim: bool = True) -> Sampler:
    def sample(op: Operand, rng: Random, d: float) -> Args | None:
        if kind == "min" and "low" in op.saturated or kind == "max" and "high" in op.saturated:
            return None
        if kind == "prod":
            dims = [i for i in range(1, op.rank) if 1 < op.shape[i] <= 8]  # longer products under/overflow
            return {"dim": rng.choice(dims), "keepdim": keepdim and rng.random() < 0.3} if dims else None
        dim = _feature_dim(op, rng, op.normalized if kind == "sum" else frozenset())
        return None if dim is None else {"dim": dim, "keepdim": keepdim and rng.random() < 0.3}

    return sample


def _mag_sum(m: float, shape: Shape, args: Args) -> float:
    return m * math.sqrt(math.prod(shape[d] for d in _dims(args)))


_REDUCTIONS: list[tuple[str, str, Reduces, Callable[[float, Shape, Args], float]]] = [
    ("torch.sum", "torch.sum({x}, dim={dim}, keepdim={keepdim})", "sum", _mag_sum),
    ("Tensor.sum", "{x}.sum(dim={dim}, keepdim={keepdim})", "sum", _mag_sum),
    ("torch.mean", "torch.mean({x}, dim={dim}, keepdim={keepdim})", "sum", lambda m, s, a: m),
    ("Tensor.mean", "{x}.mean(dim={dim}, keepdim={keepdim})", "sum", lambda m, s, a: m),
    ("torch.amax", "torch.amax({x}, dim={dim}, keepdim={keepdim})", "max", lambda m, s, a: 2 * m),
    ("torch.amin", "torch.amin({x}, dim={dim}, keepdim={keepdim})", "min", lambda m, s, a: 2 * m),
    ("torch.max", "torch.max({x}, dim={dim}, keepdim={keepdim}).values", "max", lambda m, s, a: 2 * m),
    ("Tensor.max", "{x}.max(dim={dim}, keepdim={keepdim})[0]", "max", lambda m, s, a: 2 * m),
    ("torch.min", "torch.min({x}, dim={dim}, keepdim={keepdim}).values", "min", lambda m, s, a: 2 * m),
    ("torch.logsumexp", "torch.logsumexp({x}, dim={dim}, keepdim={keepdim})", "sum", lambda m, s, a: m + 2),
    ("torch.norm", "torch.norm({x}, dim={dim}, keepdim={keepdim})", "sum", _mag_sum),
    ("torch.linalg.vector_norm", "torch.linalg.vector_norm({x}, dim={dim}, keepdim={keepdim})", "sum", _mag_sum),
    ("torch.var", "torch.var({x}, dim={dim}, keepdim={keepdim})", "sum", _mag_sq),
    ("torch.std", "torch.std({x}, dim={dim}, keepdim={keepdim})", "sum", lambda m, s, a: m),
    ("torch.prod", "torch.prod({x}, dim={dim}, keepdim={keepdim})", "prod", lambda m, s, a: m),
]
for _name, _call, _kind, _mag in _REDUCTIONS:
    _add(
        ApiEntry(
            _name,
            "reduction",
            (2, 3, 4, 5),
            _call,
            sample=_reduction_sampler(_kind),
            out_shape=_reduced,
            small_input=_kind == "prod",
            reduces=_kind,
            mag=_mag,
            effect="reduce",
            yields="nonneg" if _name in ("torch.norm", "torch.linalg.vector_norm", "torch.var", "torch.std") else "any",
        )
    )
for _name, _call, _kind in (
    ("torch.argmax", "torch.argmax({x}, dim={dim})", "max"),
    ("torch.argmin", "torch.argmin({x}, dim={dim})", "min"),
):
    _add(
        ApiEntry(
            _name,
            "index",
            (2, 3, 4, 5),
            _call,
            sample=_reduction_sampler(_kind, keepdim=False),
            out_shape=_reduced,
            out_dtype="int64",
            yields="nonneg",
            effect="terminal",
            normalizes=lambda s, a: frozenset(_dims(a)),
            reduces=_kind,
        )
    )

# Scans.
for _name, _call, _kind in (
    ("torch.cumsum", "torch.cumsum({x}, dim={dim})", "sum"),
    ("Tensor.cumsum", "{x}.cumsum(dim={dim})", "sum"),
    ("torch.cumprod", "torch.cumprod({x}, dim={dim})", "prod"),
    ("torch.logcumsumexp", "torch.logcumsumexp({x}, dim={dim})", "sum"),
):
    _add(
        ApiEntry(
            _name,
            "scan",
            (2, 3, 4, 5),
            _call,
            sample=_reduction_sampler(_kind, keepdim=False),
            small_input=_kind == "prod",
            reduces="prod" if _kind == "prod" else None,
            mag=_mag_sum if _kind == "sum" else (lambda m, s, a: m + 2),
            effect="nonlinear" if _kind == "prod" else "mix",
        )
    )
_add(
    ApiEntry(
        "torch.flip",
        "shape",
        (2, 3, 4, 5),
        "torch.flip({x}, dims=({dim},))",
        sample=lambda op, rng, d: {"dim": rng.randint(1, op.rank - 1)},
        yields="same",
        effect="affine",
    )
)
_add(
    ApiEntry(
        "torch.roll",
        "shape",
        (2, 3, 4, 5),
        "torch.roll({x}, shifts={shift}, dims={dim})",
        sample=lambda op, rng, d: {
            "dim": (dim := rng.randint(1, op.rank - 1)),
            "shift": rng.randint(1, max(1, op.shape[dim] - 1)),
        },
        yields="same",
        effect="affine",
    )
)


# Softmax-like: normalise along one non-batch dim.
def _softmax_sample(op: Operand, rng: Random, d: float) -> Args | None:
    dim = _feature_dim(op, rng)
    return None if dim is None else {"dim": dim}


def _dim_set(shape: Shape, args: Args) -> frozenset[int]:
    return frozenset({args["dim"]})


_SOFTMAXES: tuple[tuple[str, str, Domain], ...] = (
    ("torch.softmax", "torch.softmax({x}, dim={dim})", "unit"),
    ("torch.nn.functional.softmax", "F.softmax({x}, dim={dim})", "unit"),
    ("Tensor.softmax", "{x}.softmax(dim={dim})", "unit"),
    ("torch.log_softmax", "torch.log_softmax({x}, dim={dim})", "nonpos"),
    ("torch.nn.functional.log_softmax", "F.log_softmax({x}, dim={dim})", "nonpos"),
)
for _name, _call, _yields in _SOFTMAXES:
    _add(
        ApiEntry(
            _name,
            "softmax",
            (1, 2, 3, 4, 5),
            _call,
            sample=_softmax_sample,
            yields=_yields,
            normalizes=_dim_set,
            mag=_mag_one,
            effect="normalize",
        )
    )
for _name, _ctor, _yields in (
    ("torch.nn.Softmax", "nn.Softmax(dim={dim})", "unit"),
    ("torch.nn.LogSoftmax", "nn.LogSoftmax(dim={dim})", "nonpos"),
):
    _add(
        ApiEntry(
            _name,
            "softmax",
            (2, 3, 4, 5),
            "self.{m}({x})",
            layer=_ctor,
            attr="softmax",
            sample=_softmax_sample,
            yields=_yields,
            normalizes=_dim_set,
            mag=_mag_one,
            effect="normalize",
        )
    )
_add(
    ApiEntry(
        "torch.nn.functional.normalize",
        "norm",
        (2, 3, 4, 5),
        "F.normalize({x}, dim={dim})",
        sample=_softmax_sample,
        normalizes=_dim_set,
        effect="normalize",
        mag=lambda m, s, a: 1 / math.sqrt(s[a["dim"]]),
    )
)
_add(
    ApiEntry(
        "torch.nn.functional.glu",
        "activation",
        (2, 3, 4, 5),
        "F.glu({x}, dim={dim})",
        sample=lambda op, rng, d: None if op.shape[-1] % 2 else {"dim": -1},
        out_shape=lambda s, a: s[:-1] + (s[-1] // 2,),
    )
)


# Normalisation layers.
def _channels_sample(op: Operand, rng: Random, d: float) -> Args | None:
    return {"num_features": op.shape[1]} if op.rank >= 2 and op.shape[1] > 1 else None


def _norm_over(first: int) -> Callable[[Shape, Args], frozenset[int]]:
    return lambda s, a: frozenset(range(first, len(s)))


for _bn, _ranks in (("BatchNorm1d", (2, 3)), ("BatchNorm2d", (4,)), ("BatchNorm3d", (5,))):
    _add(
        ApiEntry(
            f"torch.nn.{_bn}",
            "norm",
            _ranks,
            "self.{m}({x})",
            layer=f"nn.{_bn}({{num_features}}, affine={{bias}})",
            attr="bn",
            init_args=("num_features",),
            sample=_channels_sample,
            has_bias=True,
            normalizes=lambda s, a: frozenset({0} | set(range(2, len(s)))),
            mag=_mag_one,
            effect="normalize",
        )
    )
for _rank, _inorm in ((3, "InstanceNorm1d"), (4, "InstanceNorm2d"), (5, "InstanceNorm3d")):
    _add(
        ApiEntry(
            f"torch.nn.{_inorm}",
            "norm",
            (_rank,),
            "self.{m}({x})",
            layer=f"nn.{_inorm}({{num_features}})",
            attr="inorm",
            init_args=("num_features",),
            sample=lambda op, rng, d: {"num_features": op.shape[1]} if math.prod(op.shape[2:]) > 1 else None,
            normalizes=_norm_over(2),
            mag=_mag_one,
            effect="normalize",
        )
    )


def _group_sample(op: Operand, rng: Random, d: float) -> Args | None:
    channels = op.shape[1]
    groups = [g for g in (2, 4, 8, 16) if channels % g == 0 and g < channels]
    return {"num_groups": rng.choice(groups), "num_channels": channels} if groups else None


_add(
    ApiEntry(
        "torch.nn.GroupNorm",
        "norm",
        (3, 4, 5),
        "self.{m}({x})",
        layer="nn.GroupNorm({num_groups}, {num_channels}, affine={bias})",
        has_bias=True,
        attr="gn",
        init_args=("num_groups", "num_channels"),
        sample=_group_sample,
        normalizes=_norm_over(1),
        mag=_mag_one,
        effect="normalize",
    )
)
_add(
    ApiEntry(
        "torch.nn.functional.group_norm",
        "norm",
        (3, 4, 5),
        "F.group_norm({x}, {num_groups})",
        sample=_group_sample,
        normalizes=_norm_over(1),
        mag=_mag_one,
        effect="normalize",
    )
)


def _last_dims_sample(op: Operand, rng: Random, d: float) -> Args | None:
    count = rng.randint(1, max(1, min(2, op.rank - 1)))
    shape = tuple(op.shape[-count:])
    return {"normalized_shape": shape} if math.prod(shape) > 1 else None


def _last_normalized(s: Shape, a: Args) -> frozenset[int]:
    return frozenset(range(len(s) - len(a["normalized_shape"]), len(s)))


_add(
    ApiEntry(
        "torch.nn.LayerNorm",
        "norm",
        (2, 3, 4, 5),
        "self.{m}({x})",
        layer="nn.LayerNorm({normalized_shape}, elementwise_affine={bias})",
        has_bias=True,
        attr="ln",
        init_args=("normalized_shape",),
        sample=_last_dims_sample,
        normalizes=_last_normalized,
        mag=_mag_one,
        effect="normalize",
    )
)
_add(
    ApiEntry(
        "torch.nn.functional.layer_norm",
        "norm",
        (2, 3, 4, 5),
        "F.layer_norm({x}, {normalized_shape})",
        sample=_last_dims_sample,
        normalizes=_last_normalized,
        mag=_mag_one,
        effect="normalize",
    )
)
_add(
    ApiEntry(
        "torch.nn.RMSNorm",
        "norm",
        (2, 3, 4, 5),
        "self.{m}({x})",
        layer="nn.RMSNorm({normalized_shape}, elementwise_affine={bias})",
        has_bias=True,
        attr="rms",
        init_args=("normalized_shape",),
        sample=_last_dims_sample,
        normalizes=_last_normalized,
        mag=_mag_one,
        effect="normalize",
    )
)
_add(
    ApiEntry(
        "torch.nn.functional.instance_norm",
        "norm",
        (3, 4, 5),
        "F.instance_norm({x})",
        sample=lambda op, rng, d: {} if math.prod(op.shape[2:]) > 1 else None,
        normalizes=_norm_over(2),
        mag=_mag_one,
        effect="normalize",
    )
)


# Linear maps.
def _linear_sample(op: Operand, rng: Random, d: float) -> Args:
    return {"in_features": op.shape[-1], "out_features": _pick(rng, [64, 128, 256, 512, 1024], d), "bias": True}


def _linear_flops(shape: Shape, args: Args) -> float:
    return 2.0 * math.prod(shape) * args["out_features"]


def _mag_linear(m: float, shape: Shape, args: Args) -> float:
    return m / math.sqrt(3) + 0.3


_add(
    ApiEntry(
        "torch.nn.Linear",
        "linear",
        (2, 3, 4),
        "self.{m}({x})",
        layer="nn.Linear({in_features}, {out_features}, bias={bias})",
        attr="linear",
        init_args=("in_features", "out_features"),
        sample=_linear_sample,
        out_shape=lambda s, a: s[:-1] + (a["out_features"],),
        flops=_linear_flops,
        mag=_mag_linear,
        effect="mix",
        has_bias=True,
    )
)
_add(
    ApiEntry(
        "torch.nn.functional.linear",
        "linear",
        (2, 3, 4),
        "F.linear({x}, {y})",
        second=SecondOperand(
            shape=lambda s, a: (a["out_features"], s[-1]), sources=("param",), make="torch.randn({shape}) * " + "0.05"
        ),
        sample=_linear_sample,
        out_shape=lambda s, a: s[:-1] + (a["out_features"],),
        flops=_linear_flops,
        mag=lambda m, s, a: m * 0.05 * math.sqrt(s[-1]),
        effect="mix",
    )
)
_MATMUL_SECOND = SecondOperand(shape=lambda s, a: (s[-1], a["out_features"]), make="torch.randn({shape}) * 0.05")
_MATMULS: tuple[tuple[str, str, tuple[int, ...]], ...] = (
    ("torch.matmul", "torch.matmul({x}, {y})", (2, 3, 4)),
    ("Tensor.matmul", "{x}.matmul({y})", (2, 3, 4)),
    ("torch.mm", "torch.mm({x}, {y})", (2,)),
    ("torch.einsum", "torch.einsum({equation}, {x}, {y})", (2, 3, 4)),
)
for _name, _call, _matmul_ranks in _MATMULS:
    _add(
        ApiEntry(
            _name,
            "linear",
            _matmul_ranks,
            _call,
            second=_MATMUL_SECOND,
            sample=lambda op, rng, d: {
                **_linear_sample(op, rng, d),
                "equation": "abcd"[: op.rank - 1] + "k,kn->" + "abcd"[: op.rank - 1] + "n",
            },
            out_shape=lambda s, a: s[:-1] + (a["out_features"],),
            flops=_linear_flops,
            mag=lambda m, s, a: m * 0.05 * math.sqrt(s[-1]),
            effect="mix",
        )
    )
_add(
    ApiEntry(
        "torch.bmm",
        "linear",
        (3,),
        "torch.bmm({x}, {y})",
        second=SecondOperand(
            shape=lambda s, a: (s[0], s[-1], a["out_features"]), sources=("input",), make="torch.randn({shape}) * 0.05"
        ),
        sample=_linear_sample,
        out_shape=lambda s, a: s[:-1] + (a["out_features"],),
        flops=_linear_flops,
        mag=lambda m, s, a: m * 0.05 * math.sqrt(s[-1]),
        effect="mix",
    )
)
_add(
    ApiEntry(
        "torch.nn.functional.scaled_dot_product_attention",
        "linear",
        (3, 4),
        "F.scaled_dot_product_attention({x}, {y}, {y})",
        second=SecondOperand(shape=lambda s, a: s, sources=("input",)),
        sample=lambda op, rng, d: {} if op.shape[-1] <= 256 and op.shape[-2] <= 1024 else None,
        flops=lambda s, a: 4.0 * math.prod(s) * s[-2],
        mag=lambda m, s, a: m,
        effect="mix",
    )
)
_add(
    ApiEntry(
        "torch.tril",
        "shape",
        (2, 3, 4),
        "torch.tril({x})",
        yields="same",
        effect="affine",
        saturates=frozenset({"zeros"}),
        sample=lambda op, rng, d: {} if op.shape[-1] > 1 and op.shape[-2] > 1 else None,
    )
)
_add(
    ApiEntry(
        "torch.triu",
        "shape",
        (2, 3, 4),
        "torch.triu({x})",
        yields="same",
        effect="affine",
        saturates=frozenset({"zeros"}),
        sample=lambda op, rng, d: {} if op.shape[-1] > 1 and op.shape[-2] > 1 else None,
    )
)


# Convolutions: the spatial rank is the input rank minus two.
def _conv_out(size: int, k: int, stride: int, padding: int, dilation: int = 1) -> int:
    return (size + 2 * padding - dilation * (k - 1) - 1) // stride + 1


def _conv_sampler(spatial: int, transposed: bool) -> Sampler:
    def sample(op: Operand, rng: Random, d: float) -> Args | None:
        in_channels = op.shape[1]
        sizes = op.shape[2:]
        k = rng.choice([1, 3, 3, 5] if spatial < 3 else [1, 3, 3])
        stride = rng.choice([1, 1, 2]) if min(sizes) >= 8 else 1
        padding = rng.choice([0, k // 2])
        out_channels = _pick(rng, [8, 16, 32, 64], d)
        if not transposed and any(_conv_out(s, k, stride, padding) < 1 for s in sizes):
            return None
        if transposed and stride == 2 and math.prod(sizes) * 2**spatial > 2**18:
            stride = 1
        groups = 1
        if rng.random() < 0.2 and in_channels % 2 == 0 and out_channels % 2 == 0:
            groups = 2
        return {
            "in_channels": in_channels,
            "out_channels": out_channels,
            "kernel_size": k,
            "stride": stride,
            "padding": padding,
            "groups": groups,
            "bias": True,
            "_spatial": spatial,
        }

    return sample


def _conv_shape(transposed: bool) -> ShapeFn:
    def shape(s: Shape, a: Args) -> Shape:
        k, st, p = a["kernel_size"], a["stride"], a["padding"]
        if transposed:
            spatial = tuple((n - 1) * st - 2 * p + k for n in s[2:])
        else:
            spatial = tuple(_conv_out(n, k, st, p) for n in s[2:])
        return (s[0], a["out_channels"]) + spatial

    return shape


def _conv_flops(s: Shape, a: Args) -> float:
    out = math.prod(s[2:]) * (a["stride"] ** a["_spatial"] if a.get("_transposed") else 1)
    return 2.0 * s[0] * out * a["out_channels"] * (s[1] // a["groups"]) * a["kernel_size"] ** a["_spatial"]


for _spatial in (1, 2, 3):
    for _transposed in (False, True):
        _layer_name = f"ConvTranspose{_spatial}d" if _transposed else f"Conv{_spatial}d"
        _base = _conv_sampler(_spatial, _transposed)
        _add(
            ApiEntry(
                f"torch.nn.{_layer_name}",
                "conv",
                (_spatial + 2,),
                "self.{m}({x})",
                layer=f"nn.{_layer_name}({{in_channels}}, {{out_channels}}, {{kernel_size}}, stride={{stride}}, "
                "padding={padding}, groups={groups}, bias={bias})",
                attr="conv_t" if _transposed else "conv",
                init_args=("in_channels", "out_channels", "kernel_size"),
                sample=(lambda base, t: lambda op, rng, d: None if (a := base(op, rng, d)) is None else {**a, "_transposed": t})(
                    _base, _transposed
                ),
                out_shape=_conv_shape(_transposed),
                flops=_conv_flops,
                mag=_mag_linear,
                effect="mix",
                has_bias=True,
            )
        )
for _spatial in (1, 2):
    _add(
        ApiEntry(
            f"torch.nn.functional.conv{_spatial}d",
            "conv",
            (_spatial + 2,),
            f"F.conv{_spatial}d({{x}}, {{y}}, padding={{padding}})",
            second=SecondOperand(
                shape=lambda s, a: (a["out_channels"], s[1]) + (a["kernel_size"],) * (len(s) - 2),
                sources=("param",),
                make="torch.randn({shape}) * 0.1",
            ),
            sample=(lambda base: lambda op, rng, d: None if (a := base(op, rng, d)) is None else {**a, "stride": 1, "groups": 1})(
                _conv_sampler(_spatial, False)
            ),
            out_shape=lambda s, a: _conv_shape(False)(s, {**a, "stride": 1}),
            flops=_conv_flops,
            mag=lambda m, s, a: m * 0.1 * math.sqrt(s[1] * a["kernel_size"] ** (len(s) - 2)),
            effect="mix",
        )
    )


# Pooling and resizing.
def _pool_sample(op: Operand, rng: Random, d: float) -> Args | None:
    k = rng.choice([2, 2, 3])
    if min(op.shape[2:]) < k:
        return None
    return {"kernel_size": k, "stride": k if rng.random() < 0.7 else max(1, k - 1)}


def _pool_shape(s: Shape, a: Args) -> Shape:
    return s[:2] + tuple(_conv_out(n, a["kernel_size"], a["stride"], 0) for n in s[2:])


for _spatial in (1, 2, 3):
    for _pool in ("Max", "Avg"):
        _add(
            ApiEntry(
                f"torch.nn.{_pool}Pool{_spatial}d",
                "pool",
                (_spatial + 2,),
                "self.{m}({x})",
                layer=f"nn.{_pool}Pool{_spatial}d(kernel_size={{kernel_size}}, stride={{stride}})",
                attr="pool",
                init_args=("kernel_size",),
                sample=_pool_sample,
                out_shape=_pool_shape,
                yields="same",
                effect="affine" if _pool == "Avg" else "nonlinear",
            )
        )
    _add(
        ApiEntry(
            f"torch.nn.functional.max_pool{_spatial}d",
            "pool",
            (_spatial + 2,),
            f"F.max_pool{_spatial}d({{x}}, kernel_size={{kernel_size}}, stride={{stride}})",
            sample=_pool_sample,
            out_shape=_pool_shape,
            yields="same",
        )
    )
    _add(
        ApiEntry(
            f"torch.nn.functional.avg_pool{_spatial}d",
            "pool",
            (_spatial + 2,),
            f"F.avg_pool{_spatial}d({{x}}, kernel_size={{kernel_size}}, stride={{stride}})",
            sample=_pool_sample,
            out_shape=_pool_shape,
            yields="same",
            effect="affine",
        )
    )


def _adaptive_sample(op: Operand, rng: Random, d: float) -> Args | None:
    options = [o for o in (1, 2, 4, 8) if o < min(op.shape[2:])]
    return {"output_size": rng.choice(options)} if options else None


def _adaptive_shape(s: Shape, a: Args) -> Shape:
    return s[:2] + (a["output_size"],) * (len(s) - 2)


for _spatial in (1, 2, 3):
    _add(
        ApiEntry(
            f"torch.nn.AdaptiveAvgPool{_spatial}d",
            "pool",
            (_spatial + 2,),
            "self.{m}({x})",
            layer=f"nn.AdaptiveAvgPool{_spatial}d({{output_size}})",
            attr="gap",
            sample=_adaptive_sample,
            out_shape=_adaptive_shape,
            yields="same",
            effect="affine",
        )
    )
    _add(
        ApiEntry(
            f"torch.nn.functional.adaptive_avg_pool{_spatial}d",
            "pool",
            (_spatial + 2,),
            f"F.adaptive_avg_pool{_spatial}d({{x}}, {{output_size}})",
            sample=_adaptive_sample,
            out_shape=_adaptive_shape,
            yields="same",
            effect="affine",
        )
    )
_add(
    ApiEntry(
        "torch.nn.AdaptiveMaxPool2d",
        "pool",
        (4,),
        "self.{m}({x})",
        layer="nn.AdaptiveMaxPool2d({output_size})",
        attr="gmp",
        sample=_adaptive_sample,
        out_shape=_adaptive_shape,
        yields="same",
    )
)
_add(
    ApiEntry(
        "torch.nn.functional.interpolate",
        "resize",
        (3, 4, 5),
        "F.interpolate({x}, scale_factor={scale}, mode='nearest')",
        sample=lambda op, rng, d: {"scale": 2} if op.numel <= 2**18 else None,
        out_shape=lambda s, a: s[:2] + tuple(n * a["scale"] for n in s[2:]),
        yields="same",
        effect="affine",
    )
)
_add(
    ApiEntry(
        "torch.nn.functional.pixel_shuffle",
        "resize",
        (4,),
        "F.pixel_shuffle({x}, {factor})",
        sample=lambda op, rng, d: {"factor": 2} if op.shape[1] % 4 == 0 else None,
        out_shape=lambda s, a: (s[0], s[1] // 4, s[2] * 2, s[3] * 2),
        yields="same",
        effect="shape",
    )
)
_add(
    ApiEntry(
        "torch.nn.functional.pad",
        "resize",
        (3, 4, 5),
        "F.pad({x}, {pad})",
        sample=lambda op, rng, d: {"pad": (1, 1)},
        yields="same",
        effect="affine",
        out_shape=lambda s, a: s[:-1] + (s[-1] + 2,),
    )
)


# Shape ops.
def _swap_sample(op: Operand, rng: Random, d: float) -> Args | None:
    if op.rank < 3:
        return {"a": 0, "b": 1} if op.rank == 2 else None
    a, b = rng.sample(range(1, op.rank), 2)
    return {"a": min(a, b), "b": max(a, b)}


def _swapped(s: Shape, a: Args) -> Shape:
    out = list(s)
    out[a["a"]], out[a["b"]] = out[a["b"]], out[a["a"]]
    return tuple(out)


for _name, _call in (("torch.transpose", "torch.transpose({x}, {a}, {b})"), ("Tensor.transpose", "{x}.transpose({a}, {b})")):
    _add(ApiEntry(_name, "shape", (2, 3, 4, 5), _call, sample=_swap_sample, out_shape=_swapped, yields="same", effect="shape"))


def _permute_sample(op: Operand, rng: Random, d: float) -> Args | None:
    rest = list(range(1, op.rank))
    rng.shuffle(rest)
    return {"dims": (0, *rest)} if rest != sorted(rest) else None


for _name, _call in (("torch.permute", "torch.permute({x}, {dims})"), ("Tensor.permute", "{x}.permute({dims})")):
    _add(
        ApiEntry(
            _name,
            "shape",
            (3, 4, 5),
            _call,
            sample=_permute_sample,
            out_shape=lambda s, a: tuple(s[i] for i in a["dims"]),
            yields="same",
            effect="shape",
        )
    )
for _name, _call in (("torch.flatten", "torch.flatten({x}, {start})"), ("Tensor.flatten", "{x}.flatten({start})")):
    _add(
        ApiEntry(
            _name,
            "shape",
            (3, 4, 5),
            _call,
            sample=lambda op, rng, d: {"start": rng.randint(1, op.rank - 2)},
            out_shape=lambda s, a: s[: a["start"]] + (math.prod(s[a["start"] :]),),
            yields="same",
            effect="shape",
        )
    )
_add(
    ApiEntry(
        "torch.nn.Flatten",
        "shape",
        (3, 4, 5),
        "self.{m}({x})",
        layer="nn.Flatten()",
        attr="flatten",
        out_shape=lambda s, a: (s[0], math.prod(s[1:])),
        yields="same",
        effect="shape",
    )
)
for _name, _call in (
    ("Tensor.view", "{x}.view({shape})"),
    ("Tensor.reshape", "{x}.reshape({shape})"),
    ("torch.reshape", "torch.reshape({x}, {shape})"),
):
    _add(
        ApiEntry(
            _name,
            "shape",
            (3, 4, 5),
            _call,
            sample=(lambda view: lambda op, rng, d: None if view and not op.contiguous else {"shape": (op.shape[0], -1)})(
                _name == "Tensor.view"
            ),
            out_shape=lambda s, a: (s[0], math.prod(s[1:])),
            yields="same",
            effect="shape",
        )
    )
_add(
    ApiEntry(
        "Tensor.unsqueeze",
        "shape",
        (1, 2, 3, 4),
        "{x}.unsqueeze({dim})",
        sample=lambda op, rng, d: {"dim": rng.randint(1, op.rank)},
        out_shape=lambda s, a: s[: a["dim"]] + (1,) + s[a["dim"] :],
        yields="same",
        effect="shape",
    )
)


# Losses, per element or per sample (reduction='none': a mean over a large tensor is near-constant).
def _loss(name: str, call: str, second: SecondOperand, out_shape: ShapeFn = _same, **kw: Any) -> None:
    _add(ApiEntry(name, "loss", kw.pop("ranks", (2, 3, 4)), call, second=second, out_shape=out_shape, effect="terminal", **kw))


def _classes_sample(op: Operand, rng: Random, d: float) -> Args | None:
    """Class scores: not too many classes, and not mostly exact zeros (ties make the target not matter)."""
    return None if op.saturated or op.shape[1] > 16384 else {"classes": op.shape[1]}


_TARGET = SecondOperand(shape=lambda s, a: s, sources=("input",))
_loss("torch.nn.functional.mse_loss", "F.mse_loss({x}, {y}, reduction='none')", _TARGET, yields="nonneg")
_loss("torch.nn.functional.l1_loss", "F.l1_loss({x}, {y}, reduction='none')", _TARGET, yields="nonneg")
_loss("torch.nn.functional.smooth_l1_loss", "F.smooth_l1_loss({x}, {y}, reduction='none')", _TARGET, yields="nonneg")
_loss(
    "torch.nn.functional.huber_loss",
    "F.huber_loss({x}, {y}, reduction='none', delta={delta})",
    _TARGET,
    sample=lambda op, rng, d: {"delta": rng.choice([0.5, 1.0])},
    yields="nonneg",
)
_loss(
    "torch.nn.functional.binary_cross_entropy",
    "F.binary_cross_entropy({x}, {y}, reduction='none')",
    SecondOperand(shape=lambda s, a: s, sources=("input",), make="torch.rand({shape})"),
    requires="unit",
    yields="nonneg",
)
_loss(
    "torch.nn.functional.binary_cross_entropy_with_logits",
    "F.binary_cross_entropy_with_logits({x}, {y}, reduction='none')",
    SecondOperand(shape=lambda s, a: s, sources=("input",), make="torch.rand({shape})"),
    yields="nonneg",
)
_loss(
    "torch.nn.functional.kl_div",
    "F.kl_div({x}, {y}, reduction='none')",
    SecondOperand(shape=lambda s, a: s, sources=("input",), make="torch.rand({shape})"),
    requires="nonpos",
)
_loss(
    "torch.nn.functional.soft_margin_loss",
    "F.soft_margin_loss({x}, {y}, reduction='none')",
    SecondOperand(shape=lambda s, a: s, sources=("input",), make="torch.randint(0, 2, {shape}).float() * 2 - 1"),
    small_input=True,
    yields="nonneg",
)
_loss(
    "torch.nn.functional.cross_entropy",
    "F.cross_entropy({x}, {y}, reduction='none')",
    SecondOperand(shape=lambda s, a: (s[0],), sources=("input",), make="torch.randint(0, {classes}, {shape})", dtype="int64"),
    sample=_classes_sample,
    out_shape=lambda s, a: (s[0],),
    ranks=(2,),
    yields="nonneg",
)
_loss(
    "torch.nn.functional.nll_loss",
    "F.nll_loss({x}, {y}, reduction='none')",
    SecondOperand(shape=lambda s, a: (s[0],), sources=("input",), make="torch.randint(0, {classes}, {shape})", dtype="int64"),
    sample=_classes_sample,
    out_shape=lambda s, a: (s[0],),
    ranks=(2,),
    requires="nonpos",
)
_loss(
    "torch.nn.functional.cosine_similarity",
    "F.cosine_similarity({x}, {y}, dim={dim})",
    _TARGET,
    sample=lambda op, rng, d: {"dim": 1},
    out_shape=lambda s, a: s[:1] + s[2:],
    ranks=(2, 3, 4),
    yields="bounded",
)
_loss(
    "torch.nn.functional.pairwise_distance",
    "F.pairwise_distance({x}, {y})",
    _TARGET,
    out_shape=lambda s, a: (s[0],),
    ranks=(2,),
    yields="nonneg",
)
_loss(
    "torch.nn.functional.triplet_margin_loss",
    "F.triplet_margin_loss({x}, {y}, {y}.flip(0), reduction='none')",
    _TARGET,
    out_shape=lambda s, a: (s[0],),
    ranks=(2,),
    yields="nonneg",
)


CATALOG: dict[str, ApiEntry] = {}
for _e in ENTRIES:
    assert _e.name not in CATALOG, f"duplicate catalog entry {_e.name}"
    CATALOG[_e.name] = _e
