"""The programmatic, shape-aware composer: a KernelBench-format module from an API set, no model.

The APIs are ordered the way real modules chain them (convolutions, pooling, norms, linear maps,
pointwise ops, softmax, reductions, a loss or an index last, with some shuffling in the middle),
then placed one after another on a main tensor ``x`` whose shape, dtype, value domain and rough
magnitude are tracked. Binary ops take a second forward input or a parameter. Where an API needs
another rank or value domain, minimal glue is inserted (``flatten``/``view``, ``abs``, ``sigmoid``,
a rescale); an API that cannot be placed is dropped and said so in ``details``.

Triviality is avoided by construction: a bias or broadcast parameter that a later normalisation
would cancel is removed or made full-shape, reductions skip dims a normalisation has fixed and
extremes of saturated values, and sizes are held to a FLOP budget that scales with difficulty.
"""

from __future__ import annotations

import ast
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from random import Random
from typing import Any

from proposer_svc.catalog import CATALOG, ApiEntry, Args, Domain, Operand, Shape
from proposer_svc.compose.base import ProposalHints, ProposedModule
from proposer_svc.mining import forward_api_sets
from services.outcomes import Declined

STAGES = {
    "conv": 0,
    "pool": 1,
    "resize": 1,
    "norm": 2,
    "linear": 3,
    "activation": 4,
    "pointwise": 4,
    "binary": 4,
    "shape": 4,
    "softmax": 5,
    "scan": 5,
    "reduction": 6,
    "loss": 7,
    "index": 8,
}
FIXED_STAGES = {0, 6, 7, 8}
INPUT_NAMES = ("x", "y", "z", "w", "v")
DIM_NAMES = {
    2: ("batch_size", "in_features"),
    3: ("batch_size", "in_channels", "length"),
    4: ("batch_size", "in_channels", "height", "width"),
    5: ("batch_size", "in_channels", "depth", "height", "width"),
}
PARAM_ATTRS = {"torch.add": "bias", "torch.sub": "bias", "torch.mul": "scale", "torch.div": "scale"}
POSITIVE = ("pos", "unit")
NONNEG = ("nonneg", "pos", "unit")
SATURATING_AT_ZERO = frozenset({"low"})


def flop_budget(difficulty: float) -> float:
    """FLOPs one forward may cost: ~5e6 at difficulty 0 to ~4e8 at 1 (about 0.1-50 ms on a CPU core)."""
    return 5e6 * 80 ** min(1.0, max(0.0, difficulty))


@dataclass
class _Layer:
    attr: str
    template: str
    args: Args
    init_keys: tuple[str, ...]


@dataclass
class _Param:
    attr: str
    shape: Shape
    make: str


@dataclass
class _Input:
    name: str
    shape: Shape
    make: str


@dataclass
class _Step:
    """One placement, not yet committed: glue and the API's own line, and what it adds."""

    lines: list[str]
    operand: Operand
    glue: list[str]
    layer: _Layer | None = None
    param: _Param | None = None
    param_full_shape: Shape | None = None
    new_input: _Input | None = None
    flops: float = 0.0


@dataclass
class _Module:
    rng: Random
    difficulty: float
    budget: float
    first: _Input
    operand: Operand
    layers: list[_Layer] = field(default_factory=list)
    params: list[_Param] = field(default_factory=list)
    inputs: list[_Input] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    placed: list[str] = field(default_factory=list)
    glue: list[str] = field(default_factory=list)
    dropped: dict[str, str] = field(default_factory=dict)
    flops: float = 0.0
    # Shifts and scales since the last nonlinearity that a normalisation would cancel: how to undo each.
    exposures: list[Any] = field(default_factory=list)
    attr_counts: Counter[str] = field(default_factory=Counter)

    def attr(self, base: str) -> str:
        self.attr_counts[base] += 1
        n = self.attr_counts[base]
        return base if n == 1 else f"{base}{n}"


class ProgrammaticComposer:
    name = "composer"

    def compose(self, api_set: Sequence[str], hints: ProposalHints) -> ProposedModule:
        known = [a for a in dict.fromkeys(api_set) if a in CATALOG]
        unknown = [a for a in api_set if a not in CATALOG]
        if not known:
            raise Declined(f"no API of {list(api_set)} is in the catalog")
        rng = Random(hints.seed)
        known = known[: max(1, hints.max_ops)]
        order = self._order(known, rng)
        best: _Module | None = None
        for rank in self._start_ranks(order):
            module = self._build(order, rank, hints.difficulty, Random(rng.random()))
            if module is not None and (best is None or len(module.placed) > len(best.placed)):
                best = module
        if best is None or not best.placed:
            reasons = best.dropped if best else {}
            raise Declined(f"nothing composable from {known}: {reasons}")
        for api in unknown:
            best.dropped[api] = "not in the catalog"
        source = _render(best)
        used = sorted(set().union(*forward_api_sets(ast.parse(source))))
        return ProposedModule(
            source=source,
            api_set=used,
            input_shapes=[list(i.shape) for i in best.inputs],
            origin=self.name,
            details={
                "requested": list(api_set),
                "placed": best.placed,
                "glue": best.glue,
                "dropped": best.dropped,
                "flops": best.flops,
                "difficulty": hints.difficulty,
                "output_shape": list(best.operand.shape),
                "output_dtype": best.operand.dtype,
            },
        )

    @staticmethod
    def _order(apis: list[str], rng: Random) -> list[ApiEntry]:
        def key(e: ApiEntry) -> float:
            stage = STAGES[e.kind]
            return stage if stage in FIXED_STAGES else stage + rng.uniform(-0.7, 0.7)

        entries = [CATALOG[a] for a in apis]
        rng.shuffle(entries)
        return sorted(entries, key=key)

    @staticmethod
    def _start_ranks(order: list[ApiEntry]) -> list[int]:
        """The first API's own ranks first (highest first), so a tie keeps the natural start."""
        preferred = sorted((r for r in order[0].ranks if r >= 2), reverse=True) or [2]
        return list(dict.fromkeys([*preferred, 2, 3, 4]))

    def _build(self, order: list[ApiEntry], rank: int, difficulty: float, rng: Random) -> _Module | None:
        shape = _start_shape(rank, difficulty, rng, heavy=any(e.kind in ("conv", "linear") for e in order))
        first = _Input("x", shape, "torch.randn({shape})")
        module = _Module(rng, difficulty, flop_budget(difficulty), first, Operand(shape, mag=1.0))
        module.inputs.append(first)
        for e in order:
            try:
                step = self._place(module, e)
            except _Skip as skip:
                module.dropped[e.name] = str(skip)
                continue
            _commit(module, e, step)
        return module

    def _place(self, module: _Module, e: ApiEntry) -> _Step:
        op = module.operand
        lines: list[str] = []
        glue: list[str] = []
        if op.dtype not in e.dtypes:
            if op.dtype == "int64" and e.kind != "loss":
                raise _Skip("follows an index op")
            lines.append("x = x.float()")
            glue.append("Tensor.float")
            op = replace(op, dtype="float32", domain="nonneg", mag=float(op.shape[-1] if op.shape else 1))
        if op.rank == 0:
            raise _Skip("the chain is already a scalar")
        op = _fit_rank(op, e, lines, glue)
        op = _fit_domain(op, e, lines, glue)
        if e.saturates & SATURATING_AT_ZERO and op.domain == "nonpos":
            raise _Skip("all inputs at or below zero: the output would be constant")
        args = self._sample(module, e, op)
        step = _Step(lines, op, glue)
        y = self._second_operand(module, e, op, args, step)
        out_shape = e.out_shape(op.shape, args)
        if any(n < 1 for n in out_shape):
            raise _Skip(f"empty output {out_shape}")
        step.flops += e.flops(op.shape, args)
        if module.flops + step.flops > module.budget:
            raise _Skip("over the FLOP budget")
        m = ""
        if e.layer is not None:
            m = module.attr(e.attr)
            step.layer = _Layer(m, e.layer, args, e.init_args)
        expr = e.call.format(x="x", y=y, m=m, **_literals(args))
        lines.append(f"x = {expr}")
        step.operand = _next_operand(e, op, args, out_shape, module.operand)
        return step

    def _sample(self, module: _Module, e: ApiEntry, op: Operand) -> Args:
        for _ in range(4):
            args = e.sample(op, module.rng, module.difficulty)
            if args is None:
                raise _Skip(f"no placement on a {op.rank}-d tensor of shape {op.shape}")
            args = dict(args)
            if e.has_bias:
                args["bias"] = True
            if module.flops + e.flops(op.shape, args) <= module.budget:
                return args
        raise _Skip("over the FLOP budget")

    def _second_operand(self, module: _Module, e: ApiEntry, op: Operand, args: Args, step: _Step) -> str:
        if e.second is None:
            return ""
        spec = e.second
        shape = spec.shape(op.shape, args)
        extra_inputs = len(module.inputs) - 1
        use_input = "input" in spec.sources and (
            "param" not in spec.sources or extra_inputs == 0 or (extra_inputs < 2 and module.rng.random() < 0.4)
        )
        if use_input:
            if len(module.inputs) >= len(INPUT_NAMES):
                raise _Skip("too many inputs")
            name = INPUT_NAMES[len(module.inputs)]
            step.new_input = _Input(name, shape, spec.make.replace("{classes}", str(args.get("classes", 2))))
            step.flops += math.prod(shape)
            return name
        attr = module.attr(PARAM_ATTRS.get(e.name, "weight"))
        if spec.broadcast is not None and op.rank >= 2 and module.rng.random() < 0.6:
            step.param_full_shape = shape[1:]
            shape = spec.broadcast(op.shape, args)
        step.param = _Param(attr, shape, spec.make)
        return f"self.{attr}"


class _Skip(Exception):
    """This API cannot be placed at this point of the chain."""


def _start_shape(rank: int, difficulty: float, rng: Random, heavy: bool) -> Shape:
    exponent = 14 + 6 * difficulty + rng.uniform(-1, 1) - (2 if heavy else 0)
    total = 2 ** max(10, round(exponent))
    if rank == 2:
        batch = rng.choice([16, 32, 64, 128])
        return batch, max(64, min(8192, total // batch))
    batch = rng.choice({3: [8, 16, 32], 4: [4, 8, 16], 5: [2, 4]}[rank])
    channels = rng.choice({3: [16, 32, 64], 4: [3, 8, 16, 32], 5: [3, 8, 16]}[rank])
    per_map = max(16, total // (batch * channels))
    side = 2 ** max(2, round(math.log2(per_map) / (rank - 2)))
    side = min(side, {3: 1024, 4: 128, 5: 32}[rank])
    return (batch, channels) + (side,) * (rank - 2)


def _fit_rank(op: Operand, e: ApiEntry, lines: list[str], glue: list[str]) -> Operand:
    if op.rank in e.ranks:
        return op
    above = [r for r in e.ranks if r < op.rank]
    if above:  # fold trailing dims
        target = max(above)
        if target == 1:
            raise _Skip("would fold the batch dim")
        shape = op.shape[: target - 1] + (math.prod(op.shape[target - 1 :]),)
        lines.append(f"x = x.flatten({target - 1})")
        glue.append("Tensor.flatten")
        return replace(op, shape=shape, normalized=_all_if_any(op.normalized, len(shape)))
    target = min(r for r in e.ranks if r > op.rank)
    if op.rank == 1:
        raise _Skip("a per-sample scalar cannot grow back into a tensor")
    shape = op.shape[:-1] + _split(op.shape[-1], target - op.rank + 1)
    method = "view" if op.contiguous else "reshape"
    lines.append(f"x = x.{method}({', '.join(['-1', *map(str, shape[1:])])})")
    glue.append(f"Tensor.{method}")
    return replace(op, shape=shape, normalized=_all_if_any(op.normalized, len(shape)))


def _split(n: int, parts: int) -> Shape:
    """``n`` as ``parts`` factors, the first (channels) smallest, the rest near-equal; 1s where it won't go."""
    factors: list[int] = []
    rest = n
    for i in range(parts - 1, 0, -1):
        target = round(rest ** (1 / (i + 1)))
        f = next((c for c in range(target, 1, -1) if rest % c == 0), 1)
        factors.append(f)
        rest //= f
    return tuple(factors) + (rest,)


def _fit_domain(op: Operand, e: ApiEntry, lines: list[str], glue: list[str]) -> Operand:
    need = e.requires
    if need == "nonneg" and op.domain not in NONNEG:
        lines.append("x = x.abs()")
        glue.append("Tensor.abs")
        op = replace(op, domain="nonneg")
    elif need == "pos" and op.domain not in POSITIVE:
        lines.append("x = x.abs() + 1")
        glue += ["Tensor.abs", "torch.add"]
        op = replace(op, domain="pos", mag=op.mag + 1)
    elif need == "unit" and op.domain != "unit":
        lines.append("x = torch.sigmoid(x)")
        glue.append("torch.sigmoid")
        op = replace(op, domain="unit", mag=min(op.mag, 1.0))
    elif need in ("bounded", "open") and op.domain not in ("unit", "open") and not (need == "bounded" and op.domain == "bounded"):
        lines.append("x = torch.tanh(x) * 0.9")
        glue += ["torch.tanh", "torch.mul"]
        op = replace(op, domain="open", mag=min(op.mag, 0.9))
    elif need == "nonpos" and op.domain != "nonpos":
        lines.append("x = -x.abs()")
        glue.append("Tensor.abs")
        op = replace(op, domain="nonpos")
    if e.small_input and (op.mag > 1.5 or e.reduces == "prod" and op.mag < 0.5):
        scale = 10.0 ** -math.ceil(math.log10(op.mag / 1.5)) if op.mag > 1.5 else 10.0 ** round(-math.log10(op.mag))
        lines.append(f"x = x * {scale:g}")
        glue.append("torch.mul")
        op = replace(op, mag=op.mag * scale)
    return op


def _all_if_any(dims: frozenset[int], rank: int) -> frozenset[int]:
    """After a reshape the normalised dims are unknown: assume every dim is (safe for the reduction rule)."""
    return frozenset(range(1, rank)) if dims else frozenset()


def _next_operand(e: ApiEntry, op: Operand, args: Args, shape: Shape, before: Operand) -> Operand:
    identity_like = bool(e.saturates) and e.saturates <= SATURATING_AT_ZERO and op.domain in NONNEG
    if e.yields == "same":
        domain = op.domain
    elif e.yields == "flip":
        flipped: dict[Domain, Domain] = {"nonneg": "nonpos", "pos": "nonpos", "unit": "nonpos", "nonpos": "nonneg"}
        domain = flipped.get(op.domain, op.domain)
    elif identity_like:
        domain = op.domain
    else:
        domain = e.yields
    mag = e.mag(op.mag, op.shape, args)
    if e.reduces == "sum" and e.name not in ("torch.mean", "Tensor.mean") and op.domain in NONNEG:
        mag *= math.sqrt(math.prod(op.shape[d] for d in _dims_of(args)))
    if e.kind == "pool" and e.effect == "affine" and op.domain not in NONNEG:  # averaging signed values shrinks them
        mag /= math.sqrt(math.prod(op.shape) / math.prod(shape))
    if e.normalizes is not None:
        normalized = e.normalizes(op.shape, args) - {0}
    elif e.effect in ("nonlinear", "mix", "terminal") and not identity_like:
        normalized = frozenset()
        if e.kind == "linear" and e.effect == "mix":
            normalized = op.normalized - {op.rank - 1}
    elif shape != op.shape:
        normalized = _all_if_any(op.normalized, len(shape))
    else:
        normalized = op.normalized
    if e.saturates and not identity_like:
        saturated = e.saturates
    elif e.effect in ("mix", "reduce", "normalize"):  # a monotone pointwise op keeps values piled at a bound
        saturated = frozenset()
    else:
        saturated = op.saturated
    if e.name.endswith(("transpose", "permute")):
        contiguous = False
    elif e.effect in ("mix", "reduce", "normalize") or e.name.endswith(("reshape", "flatten", "Flatten")):
        contiguous = True
    else:
        contiguous = op.contiguous
    return Operand(shape, e.out_dtype, domain, max(mag, 1e-3), saturated, normalized, contiguous)


def _dims_of(args: Args) -> tuple[int, ...]:
    dim = args.get("dim", ())
    return tuple(dim) if isinstance(dim, (tuple, list)) else (dim,)


def _commit(module: _Module, e: ApiEntry, step: _Step) -> None:
    if e.normalizes is not None:  # undo every shift/scale this normalisation would cancel
        for undo in module.exposures:
            undo()
        module.exposures.clear()
    elif (
        e.effect == "nonlinear"
        and step.param is None
        and not (e.saturates and step.operand.domain == module.operand.domain and module.operand.domain in NONNEG)
    ):
        module.exposures.clear()
    module.lines += step.lines
    module.glue += [g for g in step.glue]
    module.placed.append(e.name)
    module.flops += step.flops
    module.operand = step.operand
    if step.new_input is not None:
        module.inputs.append(step.new_input)
    if step.layer is not None:
        module.layers.append(step.layer)
        if e.has_bias:
            layer = step.layer
            module.exposures.append(lambda: layer.args.__setitem__("bias", False))
    if step.param is not None:
        module.params.append(step.param)
        if step.param_full_shape is not None:
            param, full = step.param, step.param_full_shape
            module.exposures.append(lambda: setattr(param, "shape", full))


def _literals(args: Args) -> dict[str, str]:
    return {k: repr(v) for k, v in args.items()}


def _render(module: _Module) -> str:
    constants: dict[str, Any] = {}
    names = DIM_NAMES[len(module.first.shape)]
    for name, value in zip(names, module.first.shape):
        constants[name] = value

    def constant(key: str, value: Any) -> str:
        for name, existing in constants.items():
            if (name == key or name.rsplit("_", 1)[0] == key) and existing == value:
                return name
        name, n = key, 1
        while name in constants:
            n += 1
            name = f"{key}_{n}"
        constants[name] = value
        return name

    init_params: list[str] = []
    init_lines: list[str] = []
    for layer in module.layers:
        values = _literals(layer.args)
        for key in layer.init_keys:
            values[key] = constant(key, layer.args[key])
            init_params.append(values[key])
        init_lines.append(f"self.{layer.attr} = {layer.template.format(**values)}")
    for param in module.params:
        shape_name = constant(f"{param.attr}_shape", tuple(param.shape))
        init_params.append(shape_name)
        init_lines.append(f"self.{param.attr} = nn.Parameter({param.make.format(shape=shape_name)})")
    init_params = list(dict.fromkeys(init_params))
    input_names = [i.name for i in module.inputs]
    description = " -> ".join(a.rsplit(".", 1)[1] for a in module.placed)
    body = "\n".join(f"        {line}" for line in module.lines)
    init_body = "".join(f"\n        {line}" for line in init_lines)

    def input_expr(item: _Input) -> str:
        if item is module.first:
            dims = ", ".join(names)
        else:
            dims = ", ".join(
                ("batch_size" if i == 0 and n == constants["batch_size"] else str(n)) for i, n in enumerate(item.shape)
            )
            dims = f"({dims},)" if "randint" in item.make else dims
        return item.make.format(shape=dims)

    constant_lines = "\n".join(f"{k} = {v!r}" for k, v in constants.items())
    return f'''import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """{description}"""

    def __init__(self{"".join(", " + p for p in init_params)}):
        super().__init__(){init_body}

    def forward(self, {", ".join(input_names)}):
{body}
        return x


{constant_lines}


def get_inputs():
    return [{", ".join(input_expr(i) for i in module.inputs)}]


def get_init_inputs():
    return [{", ".join(init_params)}]
'''
