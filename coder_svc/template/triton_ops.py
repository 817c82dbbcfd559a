"""Triton expressions for the pointwise vocabulary, in fp32, written to match PyTorch's formulas.

Only core ``tl`` functions are used (no libdevice), so the same source runs compiled on a GPU
and under ``TRITON_INTERPRET=1`` on a CPU; tanh, softplus and friends are the stable textbook
forms (errors of a few fp32 ulps, far inside the 1e-4 tolerance).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

HELPERS = """
@triton.jit
def _kz_tanh(x):
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0.0, -t, t)


@triton.jit
def _kz_softplus(x):
    return tl.maximum(x, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(x)))


@triton.jit
def _kz_mul(a, b):
    return a * b


@triton.jit
def _kz_smooth_l1(d, beta):
    z = tl.abs(d)
    return tl.where(z < beta, 0.5 * z * z / beta, z - 0.5 * beta)


@triton.jit
def _kz_huber(d, delta):
    z = tl.abs(d)
    return tl.where(z < delta, 0.5 * z * z, delta * (z - 0.5 * delta))


def _kz_split(R, BLOCK_R, programs):
    # Programs per row's reduced range, and the share each takes (whole tiles): rows too few to
    # fill the GPU (a whole-tensor mean is one) share their range, up to about 1024 programs in
    # all, each at least 4 tiles so the partials stay a small extra pass.
    split = min(triton.cdiv(R, 4 * BLOCK_R), triton.cdiv(1024, programs))
    if split <= 1:
        return 1, R
    chunk = triton.cdiv(triton.cdiv(R, split), BLOCK_R) * BLOCK_R
    return triton.cdiv(R, chunk), chunk
"""

SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946


def literal(value: Any) -> str:
    if isinstance(value, bool):
        return "1.0" if value else "0.0"
    if isinstance(value, float):
        if math.isinf(value):
            return "float('inf')" if value > 0 else "float('-inf')"
        return repr(value)
    if isinstance(value, int):
        return repr(float(value)) if abs(value) < 2**53 else repr(value)
    raise TypeError(f"not a scalar: {value!r}")


def _clamp(args: list[str], attrs: dict[str, Any]) -> str:
    x, rest = args[0], list(args[1:])
    if attrs["has_min"]:
        x = f"tl.maximum({x}, {rest.pop(0)})"
    if attrs["has_max"]:
        x = f"tl.minimum({x}, {rest.pop(0)})"
    return x


def _pow(args: list[str], attrs: dict[str, Any], scalars: list[Any]) -> str:
    base, exponent = args
    if scalars[1] is not None:  # tensor ** constant: exact forms for the common exponents
        e = float(scalars[1])
        if e == 1:
            return base
        if e == 2:
            return f"({base} * {base})"
        if e == 3:
            return f"({base} * {base} * {base})"
        if e == 0.5:
            return f"tl.sqrt({base})"
        if e == -1:
            return f"(1.0 / {base})"
        if e == -0.5:
            return f"(1.0 / tl.sqrt({base}))"
        magnitude = f"tl.exp({literal(e)} * tl.log(tl.abs({base})))"
        if e.is_integer():
            odd = int(e) % 2 == 1
            return f"tl.where({base} < 0.0, -{magnitude}, {magnitude})" if odd else magnitude
        return f"tl.where({base} < 0.0, float('nan'), {magnitude})"
    if scalars[0] is not None:  # constant ** tensor
        b = float(scalars[0])
        if b > 0:
            return f"tl.exp({literal(math.log(b))} * {exponent})"
    return f"tl.exp({exponent} * tl.log({base}))"


UNARY: dict[str, Callable[[str, dict[str, Any]], str]] = {
    "relu": lambda x, a: f"tl.maximum({x}, 0.0)",
    "relu6": lambda x, a: f"tl.minimum(tl.maximum({x}, 0.0), 6.0)",
    "sigmoid": lambda x, a: f"(1.0 / (1.0 + tl.exp(-{x})))",
    "tanh": lambda x, a: f"_kz_tanh({x})",
    "exp": lambda x, a: f"tl.exp({x})",
    "exp2": lambda x, a: f"tl.exp2({x})",
    "expm1": lambda x, a: f"(tl.exp({x}) - 1.0)",
    "log": lambda x, a: f"tl.log({x})",
    "log2": lambda x, a: f"tl.log2({x})",
    "log1p": lambda x, a: f"tl.log(1.0 + {x})",
    "sqrt": lambda x, a: f"tl.sqrt({x})",
    "rsqrt": lambda x, a: f"(1.0 / tl.sqrt({x}))",
    "abs": lambda x, a: f"tl.abs({x})",
    "neg": lambda x, a: f"(-{x})",
    "square": lambda x, a: f"({x} * {x})",
    "reciprocal": lambda x, a: f"(1.0 / {x})",
    "erf": lambda x, a: f"tl.erf({x})",
    "sin": lambda x, a: f"tl.sin({x})",
    "cos": lambda x, a: f"tl.cos({x})",
    "floor": lambda x, a: f"tl.floor({x})",
    "ceil": lambda x, a: f"tl.ceil({x})",
    "sign": lambda x, a: f"tl.where({x} > 0.0, 1.0, tl.where({x} < 0.0, -1.0, 0.0))",
    "silu": lambda x, a: f"({x} / (1.0 + tl.exp(-{x})))",
    "mish": lambda x, a: f"({x} * _kz_tanh(_kz_softplus({x})))",
    "selu": lambda x, a: f"({SELU_SCALE!r} * tl.where({x} > 0.0, {x}, {SELU_ALPHA!r} * (tl.exp({x}) - 1.0)))",
    "elu": lambda x, a: f"tl.where({x} > 0.0, {x}, {literal(a['alpha'])} * (tl.exp({x}) - 1.0))",
    "celu": lambda x, a: f"tl.where({x} > 0.0, {x}, {literal(a['alpha'])} * (tl.exp({x} / {literal(a['alpha'])}) - 1.0))",
    "leaky_relu": lambda x, a: f"tl.where({x} > 0.0, {x}, {x} * {literal(a['negative_slope'])})",
    "hardtanh": lambda x, a: f"tl.minimum(tl.maximum({x}, {literal(a['min_val'])}), {literal(a['max_val'])})",
    "hardsigmoid": lambda x, a: f"(tl.minimum(tl.maximum({x} + 3.0, 0.0), 6.0) / 6.0)",
    "hardswish": lambda x, a: f"({x} * tl.minimum(tl.maximum({x} + 3.0, 0.0), 6.0) / 6.0)",
    "softsign": lambda x, a: f"({x} / (1.0 + tl.abs({x})))",
    "logsigmoid": lambda x, a: f"(tl.minimum({x}, 0.0) - tl.log(1.0 + tl.exp(-tl.abs({x}))))",
    "tanhshrink": lambda x, a: f"({x} - _kz_tanh({x}))",
    "softplus": lambda x, a: (
        f"tl.where({x} * {literal(a['beta'])} > {literal(a['threshold'])}, {x}, "
        f"_kz_softplus({x} * {literal(a['beta'])}) / {literal(a['beta'])})"
    ),
    "threshold": lambda x, a: f"tl.where({x} > {literal(a['threshold'])}, {x}, {literal(a['value'])})",
    "gelu": lambda x, a: (
        f"(0.5 * {x} * (1.0 + tl.erf({x} * 0.7071067811865476)))"
        if a["approximate"] == "none"
        else f"(0.5 * {x} * (1.0 + _kz_tanh(0.7978845608028654 * ({x} + 0.044715 * {x} * {x} * {x}))))"
    ),
}

# loss functionals' pointwise parts (reduction='none') over (input, target), ATen's formulas; kl_div's
# xlogy(t, t) is 0 where t == 0 and t * log(t) elsewhere (NaN for a NaN or negative t, as in PyTorch)
LOSSES: dict[str, Callable[[str, str, dict[str, Any]], str]] = {
    "mse_loss": lambda x, t, a: f"(({x} - {t}) * ({x} - {t}))",
    "l1_loss": lambda x, t, a: f"tl.abs({x} - {t})",
    "smooth_l1_loss": lambda x, t, a: f"_kz_smooth_l1({x} - {t}, {literal(a['beta'])})",
    "huber_loss": lambda x, t, a: f"_kz_huber({x} - {t}, {literal(a['delta'])})",
    "kl_div": lambda x, t, a: (
        f"(tl.exp({t}) * ({t} - {x}))" if a["log_target"] else f"(tl.where({t} == 0.0, 0.0, {t} * tl.log({t})) - {t} * {x})"
    ),
}

BINARY_INFIX = {
    "add": "+",
    "sub": "-",
    "mul": "*",
    "div": "/",
    "gt": ">",
    "lt": "<",
    "ge": ">=",
    "le": "<=",
    "eq": "==",
    "ne": "!=",
}


def expression(fn: str, args: list[str], attrs: dict[str, Any], scalars: list[Any]) -> str:
    """The Triton expression of one pointwise op; ``scalars[i]`` is the constant behind ``args[i]`` (else None)."""
    if fn in UNARY:
        return UNARY[fn](args[0], attrs)
    if fn == "clamp":
        return _clamp(args, attrs)
    if fn == "where":
        return f"tl.where({args[0]}, {args[1]}, {args[2]})"
    if fn == "pow":
        return _pow(args, attrs, scalars)
    if fn in LOSSES:
        return LOSSES[fn](args[0], args[1], attrs)
    a, b = args
    if fn in ("add", "sub", "rsub") and "alpha" in attrs:
        b = f"({literal(attrs['alpha'])} * {b})" if fn != "rsub" else b
        a = f"({literal(attrs['alpha'])} * {a})" if fn == "rsub" else a
    if fn == "rsub":
        return f"({b} - {a})"
    if fn in BINARY_INFIX:
        return f"({a} {BINARY_INFIX[fn]} {b})"
    if fn in ("maximum", "fmax"):
        return f"tl.maximum({a}, {b})"
    if fn in ("minimum", "fmin"):
        return f"tl.minimum({a}, {b})"
    raise KeyError(fn)


def supports(fn: str) -> bool:
    return (
        fn in UNARY
        or fn in BINARY_INFIX
        or fn in LOSSES
        or fn in ("clamp", "where", "pow", "rsub", "maximum", "minimum", "fmax", "fmin")
    )
