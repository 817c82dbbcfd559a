"""Emit a KernelBench ``ModelNew`` from a fusion plan: Triton kernels, their launchers, and a
forward that calls PyTorch for the heavy ops and a launcher for each fused group.

``ModelNew`` subclasses the reference's ``Model`` (whose source is included verbatim), so the
constructor, parameters and their order are the reference's own: under the same seed both hold
the same weights. Only ``forward`` is replaced.

Kernels are written from the group's traced structure (which dims are reduced, which inputs
broadcast, whether offsets need 64 bits); sizes and strides are read at run time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from coder_svc.template.fusion import External, Group, Plan
from coder_svc.template.graph import DtypeConst, Graph, Node, NodeRef, Opaque, SliceConst, TupleConst, is_name
from coder_svc.template.lowering import Elementwise, Norm, Pool, Reduce, Softmax
from coder_svc.template.normalization import norm_kernel, norm_launcher
from coder_svc.template.pooling import pool_kernel, pool_launcher
from coder_svc.template.triton_ops import HELPERS, expression, literal
from services.outcomes import Declined

# 2: reductions over few rows split their range across programs; 3: batch, instance and group norms;
# 4: max and average pools (adaptive ones too, where the windows divide evenly); 5: loss functionals
# (kl_div, smooth_l1, huber, mse, l1) as their pointwise loss and reduction
VERSION = "template-5"
TILE = 2048  # elements per 2D reduction tile
INT32_LIMIT = 2**31 - 2**22  # beyond this many elements, offsets are computed in 64 bits
TORCH_DTYPES = {
    "float32",
    "float16",
    "bfloat16",
    "float64",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint8",
    "bool",
    "complex64",
    "complex128",
}
FUNCTION_PREFIXES = ("torch.", "operator.", "math.")
BUILTINS = {"getattr", "len", "int", "float", "min", "max", "abs", "tuple", "list", "range", "sum"}
NEUTRAL = {
    "sum": "0.0",
    "mean": "0.0",
    "norm1": "0.0",
    "norm2": "0.0",
    "prod": "1.0",
    "max": "float('-inf')",
    "min": "float('inf')",
}


# ---------------------------------------------------------------- the forward (PyTorch side)


class ForwardWriter:
    def __init__(self, plan: Plan) -> None:
        self.plan = plan

    def var(self, name: str) -> str:
        return f"v_{self.plan.resolve(name)}"

    def device_of(self) -> str:
        """Where the forward's inputs are: the first input's device."""
        first = next((n for n in self.plan.graph.nodes if n.op == "placeholder" and n.tensor), None)
        if first is None:
            raise Declined("the forward makes a constant tensor but takes no tensor to place it beside")
        return f"{self.var(first.name)}.device"

    def arg(self, value: Any) -> str:
        if isinstance(value, NodeRef):
            return self.var(value.node)
        if isinstance(value, DtypeConst):
            if value.dtype not in TORCH_DTYPES:
                raise Declined(f"unknown dtype {value.dtype}")
            return f"torch.{value.dtype}"
        if isinstance(value, SliceConst):
            return f"slice({', '.join(self.arg(v) for v in value.slice)})"
        if isinstance(value, TupleConst):
            return "(" + "".join(self.arg(v) + ", " for v in value.tuple) + ")"
        if isinstance(value, list):
            return "[" + ", ".join(self.arg(v) for v in value) + "]"
        if isinstance(value, Opaque):
            raise Declined(f"the forward uses a constant of type {value.opaque}, which the generator cannot write")
        if isinstance(value, float) and math.isinf(value):
            return "float('inf')" if value > 0 else "float('-inf')"
        if isinstance(value, (bool, int, float, str)) or value is None:
            return repr(value)
        raise Declined(f"cannot write the constant {value!r}")

    def call_args(self, node: Node, skip: int = 0) -> str:
        parts = [self.arg(a) for a in node.args[skip:]]
        for key, value in node.kwargs.items():
            if not is_name(key):
                raise Declined(f"keyword {key!r}")
            parts.append(f"{key}={self.arg(value)}")
        return ", ".join(parts)

    @staticmethod
    def attribute_chain(target: str) -> str:
        chain = "self"
        for part in target.split("."):
            chain = f"{chain}.{part}" if is_name(part) else f"getattr({chain}, {part!r})"
        return chain

    def statement(self, node: Node) -> str:
        if node.op == "get_attr":
            if node.value is not None:  # made in forward from literals: made again, on the inputs' device
                dtype = self.arg(DtypeConst(dtype=node.tensor.dtype if node.tensor else "float32"))
                return f"{self.var(node.name)} = torch.tensor({self.arg(node.value)}, dtype={dtype}, device={self.device_of()})"
            return f"{self.var(node.name)} = {self.attribute_chain(node.target)}"
        if node.op == "call_module":
            return f"{self.var(node.name)} = {self.attribute_chain(node.target)}({self.call_args(node)})"
        if node.op == "call_method":
            if not is_name(node.target) or not node.args:
                raise Declined(f"method {node.target}")
            return f"{self.var(node.name)} = {self.arg(node.args[0])}.{node.target}({self.call_args(node, skip=1)})"
        if node.op == "call_function":
            target = node.target
            if target.startswith("builtins."):
                target = target.removeprefix("builtins.")
                if target not in BUILTINS:
                    raise Declined(f"the forward calls {target}()")
            elif not target.startswith(FUNCTION_PREFIXES) or target.startswith("torch._"):
                raise Declined(f"the forward calls {target}, which the generator cannot name")
            return f"{self.var(node.name)} = {target}({self.call_args(node)})"
        raise Declined(f"node kind {node.op}")


def forward_source(plan: Plan) -> str:
    writer = ForwardWriter(plan)
    params, body = [], []
    for node in plan.graph.nodes:
        if node.op == "placeholder":
            if node.target.startswith("*") or not is_name(node.target):
                raise Declined("the forward takes *args or **kwargs")
            default = f"={writer.arg(node.args[0])}" if node.args else ""
            params.append(f"v_{node.name}{default}")
        elif node.op == "output":
            body.append(f"return {writer.arg(node.args[0])}")
        elif node.name in plan.aliases:
            continue
        elif node.name in plan.group_of:
            group = plan.groups[plan.group_of[node.name]]
            if node.name == group.head:
                inputs = ", ".join(writer.var(v) for v in launcher_inputs(group))
                if group.reduction and isinstance(group.reduction[1], Norm):  # its launcher reads the module's state
                    inputs = f"{writer.attribute_chain(group.reduction[1].module)}, {inputs}"
                body.append(f"{writer.var(node.name)} = kz_run_{group.index}({inputs})")
        else:
            body.append(writer.statement(node))
    lines = ["class ModelNew(Model):", f"    def forward(self, {', '.join(params)}):"]
    lines += [f"        {line}" for line in body]
    return "\n".join(lines) + "\n"


def launcher_inputs(group: Group) -> list[str]:
    seen: list[str] = []
    for external in group.externals:
        if external.value not in seen:
            seen.append(external.value)
    return seen


# ---------------------------------------------------------------- kernels


@dataclass
class KernelText:
    lines: list[str] = field(default_factory=list)

    def add(self, line: str, depth: int = 1) -> None:
        self.lines.append("    " * depth + line)


class KernelWriter:
    """One group's @triton.jit kernel (two for a reduction split across programs) and its Python launcher."""

    def __init__(self, group: Group, graph: Graph) -> None:
        self.g = group
        self.nodes = graph.by_name()
        self.k = group.index
        self.rank = len(group.domain)
        self.reduction = group.reduction[1] if group.reduction else None
        sizes = [math.prod(group.domain)] + [math.prod(e.shape) for e in group.externals]
        self.largest = max(sizes)
        self.wide = self.largest >= INT32_LIMIT
        if isinstance(self.reduction, Reduce):
            self.d0, self.d1 = self.reduction.dims
        elif isinstance(self.reduction, Softmax):
            self.d0, self.d1 = self.reduction.dim, self.reduction.dim + 1
        else:
            self.d0 = self.d1 = 0
        self.rows_layout = math.prod(group.domain[self.d1 :]) == 1

    # -- the group's reduction, for the code paths that run only for groups that have one
    @property
    def reduced(self) -> Reduce | Softmax | Norm | Pool:
        assert self.reduction is not None, "only a group with a reduction, softmax, norm or pool writes this part"
        return self.reduction

    @property
    def reduced_name(self) -> str:
        assert self.g.reduction is not None, "only a group with a reduction or softmax writes this part"
        return self.g.reduction[0]

    @property
    def reduce(self) -> Reduce:
        assert isinstance(self.reduction, Reduce), "only a reduction group writes this part"
        return self.reduction

    @property
    def reshapes(self) -> bool:
        """Whether the post chain runs over another shape than the input's (reduced or pooled)."""
        return isinstance(self.reduction, (Reduce, Pool))

    # -- externals: flat (same shape as the phase's domain, made contiguous) or strided (broadcast)
    def phase_domain(self, phase: str) -> tuple[int, ...]:
        if phase == "pre" or not self.reshapes:
            return self.g.domain
        return self.g.post_domain

    def flat(self, e: External) -> bool:
        return tuple(e.shape) == self.phase_domain(e.phase)

    def strided(self, phase: str) -> list[int]:
        return [k for k, e in enumerate(self.g.externals) if e.phase == phase and not self.flat(e)]

    def nontrivial(self, dims: range) -> list[int]:
        return [d for d in dims if self.g.domain[d] != 1]

    def decompose(self, text: KernelText, var: str, dims: range, depth: int) -> dict[int, str]:
        """Coordinates of ``var`` (a flat index over ``dims`` of the domain), one per non-trivial dim."""
        dims_ = self.nontrivial(dims)
        coords: dict[int, str] = {}
        rem = var
        for j, d in enumerate(reversed(dims_)):
            if j == len(dims_) - 1:
                coords[d] = rem
            else:
                text.add(f"c{d} = {rem} % S{d}", depth)
                text.add(f"q{d} = {rem} // S{d}", depth)
                coords[d], rem = f"c{d}", f"q{d}"
        return coords

    @staticmethod
    def strided_offset(k: int, coords: dict[int, str]) -> str | None:
        terms = [f"{c} * e{k}_s{d}" for d, c in sorted(coords.items())]
        return " + ".join(terms) if terms else None

    def load(self, text: KernelText, k: int, offset: str, mask: str, depth: int) -> str:
        text.add(f"x{k} = tl.load(e{k} + {offset}, mask={mask}, other=0.0).to(tl.float32)", depth)
        return f"x{k}"

    def emit_ops(self, text: KernelText, ops: list[tuple[str, Elementwise]], env: dict[str, str], depth: int) -> None:
        for name, op in ops:
            args: list[str] = []
            scalars: list[float | int | bool | None] = []
            for operand in op.operands:
                if isinstance(operand, str):
                    args.append(env[operand])
                    scalars.append(None)
                else:
                    args.append(literal(operand))
                    scalars.append(operand)
            text.add(f"t_{name} = {expression(op.fn, args, dict(op.attrs), scalars)}", depth)
            env[name] = f"t_{name}"

    def load_phase(
        self,
        text: KernelText,
        phase: str,
        flat: str,
        mask: str,
        coords: dict[int, str],
        shape_row: str | None,
        shape_col: str | None,
        depth: int,
    ) -> dict[str, str]:
        """Load every external of a phase; 2D contexts join a row part and a column part."""
        env: dict[str, str] = {}
        for k, e in enumerate(self.g.externals):
            if e.phase != phase:
                continue
            if self.flat(e):
                env[e.value] = self.load(text, k, flat, mask, depth)
                continue
            if shape_row is None:  # 1D context
                offset = self.strided_offset(k, coords) or f"{flat} * 0"
            else:
                row_coords = {d: c for d, c in coords.items() if not self.d0 <= d < self.d1}
                col_coords = {d: c for d, c in coords.items() if self.d0 <= d < self.d1}
                row = self.strided_offset(k, row_coords) or shape_row
                col = self.strided_offset(k, col_coords) or shape_col
                offset = f"({row})[:, None] + ({col})[None, :]"
            env[e.value] = self.load(text, k, offset, mask, depth)
        return env

    def signature(self, extra: list[str], constexprs: list[str], name: str = "") -> str:
        args = ["out_ptr"] + [f"e{k}" for k in range(len(self.g.externals))] + extra
        args += [f"S{d}" for d in range(self.rank)]
        for k in range(len(self.g.externals)):
            if k in self.strided("pre") + self.strided("post"):
                args += [f"e{k}_s{d}" for d in range(self.rank)]
        args += [f"{c}: tl.constexpr" for c in constexprs]
        return f"def {name or f'kz_kernel_{self.k}'}({', '.join(args)}):"

    # -- pointwise
    def pointwise_kernel(self) -> list[str]:
        text = KernelText(["@triton.jit", self.signature(["n"], ["BLOCK"])])
        pid = "tl.program_id(0).to(tl.int64)" if self.wide else "tl.program_id(0)"
        text.add(f"offs = {pid} * BLOCK + tl.arange(0, BLOCK)")
        text.add("mask = offs < n")
        coords = self.decompose(text, "offs", range(self.rank), 1) if self.strided("pre") else {}
        env = self.load_phase(text, "pre", "offs", "mask", coords, None, None, 1)
        self.emit_ops(text, self.g.pre, env, 1)
        text.add(f"tl.store(out_ptr + offs, {env[self.g.head]}.to(out_ptr.dtype.element_ty), mask=mask)")
        return text.lines

    # -- reductions and softmax: rows of the reduced range, 2D tiles [BLOCK_M, BLOCK_R]
    def row_prologue(self, text: KernelText) -> dict[int, str]:
        cast = ".to(tl.int64)" if self.wide else ""
        if self.rows_layout:
            text.add(f"o = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)){cast}")
            text.add("i = o * 0")
            text.add("row_mask = o < OUTER")
        else:
            text.add(f"i = (tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)){cast}")
            text.add(f"o = (i * 0 + tl.program_id(0)){cast}")
            text.add("row_mask = i < INNER")
        text.add("base = o * (R * INNER) + i")
        text.add("orow = o * INNER + i")
        text.add("zr = o * 0")
        need = self.strided("pre") or self.strided("post")
        coords: dict[int, str] = {}
        if need:
            coords.update(self.decompose(text, "o", range(0, self.d0), 1))
            coords.update(self.decompose(text, "i", range(self.d1, self.rank), 1))
        return coords

    def column_block(self, text: KernelText, row_coords: dict[int, str], depth: int) -> tuple[dict[str, str], str]:
        """Inside a loop over the reduced range: this chunk's mask, loads and pre-reduction chain."""
        cast = ".to(tl.int64)" if self.wide else ""
        text.add(f"r = (r0 + tl.arange(0, BLOCK_R)){cast}", depth)
        text.add("mask2 = row_mask[:, None] & (r < R)[None, :]", depth)
        text.add("zc = r * 0", depth)
        coords = dict(row_coords)
        if self.strided("pre"):
            coords.update(self.decompose(text, "r", range(self.d0, self.d1), depth))
        flat = "base[:, None] + r[None, :]" if self.rows_layout else "base[:, None] + r[None, :] * INNER"
        env = self.load_phase(text, "pre", flat, "mask2", coords, "zr", "zc", depth)
        self.emit_ops(text, self.g.pre, env, depth)
        source = self.reduced.source
        return env, env[source]

    def reduction_kernel(self) -> list[str]:
        red = self.reduction
        assert red is not None
        if red.kind in NEUTRAL:
            return self.split_reduction_kernels()
        text = KernelText(["@triton.jit", self.signature(["OUTER", "R", "INNER"], ["BLOCK_M", "BLOCK_R"])])
        row_coords = self.row_prologue(text)
        loop = "for r0 in range(0, R, BLOCK_R):"
        kind = red.kind
        if kind in ("logsumexp", "softmax", "log_softmax"):
            text.add("m2 = tl.full([BLOCK_M, BLOCK_R], float('-inf'), tl.float32)")
            text.add("s2 = tl.zeros([BLOCK_M, BLOCK_R], dtype=tl.float32)")
            text.add(loop)
            _, v = self.column_block(text, row_coords, 2)
            text.add(f"vv = tl.where(mask2, {v}, float('-inf'))", 2)
            text.add("m_new = tl.maximum(m2, vv)", 2)
            text.add("m_safe = tl.where(m_new == float('-inf'), 0.0, m_new)", 2)
            text.add("s2 = s2 * tl.exp(m2 - m_safe) + tl.exp(vv - m_safe)", 2)
            text.add("m2 = m_new", 2)
            text.add("m = tl.max(m2, axis=1)")
            text.add("m_row = tl.where(m == float('-inf'), 0.0, m)")
            text.add("s = tl.sum(s2 * tl.exp(m2 - m_row[:, None]), axis=1)")
            if kind == "logsumexp":
                text.add("res = tl.log(s) + m_row")
            else:
                text.add(loop)
                env, v = self.column_block(text, row_coords, 2)
                if kind == "softmax":
                    text.add(f"y = tl.exp({v} - m_row[:, None]) / s[:, None]", 2)
                else:
                    text.add(f"y = {v} - m_row[:, None] - tl.log(s)[:, None]", 2)
                env[self.reduced_name] = "y"
                flat = "base[:, None] + r[None, :]" if self.rows_layout else "base[:, None] + r[None, :] * INNER"
                env.update(self.load_phase(text, "post", flat, "mask2", self._all_coords(text, row_coords), "zr", "zc", 2))
                self.emit_ops(text, self.g.post, env, 2)
                text.add(f"tl.store(out_ptr + {flat}, {env[self.g.head]}.to(out_ptr.dtype.element_ty), mask=mask2)", 2)
                return text.lines
        elif kind in ("var", "std"):
            text.add("acc = tl.zeros([BLOCK_M, BLOCK_R], dtype=tl.float32)")
            text.add(loop)
            _, v = self.column_block(text, row_coords, 2)
            text.add(f"acc += tl.where(mask2, {v}, 0.0)", 2)
            text.add("mu = tl.sum(acc, axis=1) / R")
            text.add("acc = tl.zeros([BLOCK_M, BLOCK_R], dtype=tl.float32)")
            text.add(loop)
            _, v = self.column_block(text, row_coords, 2)
            text.add(f"d = tl.where(mask2, {v} - mu[:, None], 0.0)", 2)
            text.add("acc += d * d", 2)
            text.add(f"res = tl.sum(acc, axis=1) / (R - {literal(self.reduce.correction)})")
            if kind == "std":
                text.add("res = tl.sqrt(res)")
        self.store_rows(text, row_coords, 1)
        return text.lines

    # -- decomposable reductions (sum, mean, norms, prod, max, min): the reduced range can be split
    # across programs when the rows alone are too few to fill the GPU (a whole-tensor mean is one
    # row); each program then writes a partial to a scratch buffer and a second kernel combines them.
    def split_reduction_kernels(self) -> list[str]:
        kind = self.reduce.kind
        neutral = NEUTRAL[kind]
        combine = {"max": "tl.max({}, axis=1)", "min": "tl.min({}, axis=1)", "prod": "tl.reduce({}, 1, _kz_mul)"}.get(
            kind, "tl.sum({}, axis=1)"
        )
        text = KernelText(
            [
                "@triton.jit",
                self.signature(["part_ptr", "OUTER", "R", "INNER", "CHUNK", "SPLIT"], ["BLOCK_M", "BLOCK_R", "PARTIAL"]),
            ]
        )
        row_coords = self.row_prologue(text)
        # a chunk's loop runs past R on the last chunk (masked): to under 1.5 R + a tile, so 64-bit from half the int32 range
        cast = ".to(tl.int64)" if self.wide or self.largest >= INT32_LIMIT // 2 else ""
        text.add(f"part = tl.program_id({1 if self.rows_layout else 2}){cast}")
        text.add(f"acc = tl.full([BLOCK_M, BLOCK_R], {neutral}, tl.float32)")
        text.add("for r0 in range(part * CHUNK, part * CHUNK + CHUNK, BLOCK_R):")
        _, v = self.column_block(text, row_coords, 2)
        value = {"norm2": f"{v} * {v}", "norm1": f"tl.abs({v})"}.get(kind, v)
        text.add(f"v = tl.where(mask2, {value}, {neutral})", 2)
        step = {"max": "tl.maximum(acc, v)", "min": "tl.minimum(acc, v)", "prod": "acc * v"}.get(kind, "acc + v")
        text.add(f"acc = {step}", 2)
        text.add(f"res = {combine.format('acc')}")
        text.add("if PARTIAL:")
        text.add("tl.store(part_ptr + orow * SPLIT + part, res, mask=row_mask)", 2)
        text.add("else:")
        self.finish_rows(text, kind, row_coords, 2)

        finish = KernelText(
            [
                "@triton.jit",
                self.signature(
                    ["part_ptr", "OUTER", "R", "INNER", "SPLIT"], ["BLOCK_M", "BLOCK_S"], name=f"kz_kernel_{self.k}_finish"
                ),
            ]
        )
        finish_coords = self.row_prologue(finish)
        finish.add("s = tl.arange(0, BLOCK_S)")
        finish.add(
            f"p = tl.load(part_ptr + orow[:, None] * SPLIT + s[None, :], mask=row_mask[:, None] & (s < SPLIT)[None, :], "
            f"other={neutral})"
        )
        finish.add(f"res = {combine.format('p')}")
        self.finish_rows(finish, kind, finish_coords, 1)
        return text.lines + ["", ""] + finish.lines

    def finish_rows(self, text: KernelText, kind: str, row_coords: dict[int, str], depth: int) -> None:
        """From the combined accumulator ``res``: the reduction's own last step, then the rows' store."""
        if kind == "mean":
            text.add("res = res / R", depth)
        elif kind == "norm2":
            text.add("res = tl.sqrt(res)", depth)
        self.store_rows(text, row_coords, depth)

    def store_rows(self, text: KernelText, row_coords: dict[int, str], depth: int) -> None:
        """``res`` (one value per row) through the post-reduction chain into ``out``."""
        env = {self.reduced_name: "res"}
        env.update(self.load_phase(text, "post", "orow", "row_mask", dict(row_coords), None, None, depth))
        self.emit_ops(text, self.g.post, env, depth)
        text.add(f"tl.store(out_ptr + orow, {env[self.g.head]}.to(out_ptr.dtype.element_ty), mask=row_mask)", depth)

    def _all_coords(self, text: KernelText, row_coords: dict[int, str]) -> dict[int, str]:
        """Coordinates for the softmax's post chain (the full domain): rows' plus this chunk's."""
        coords = dict(row_coords)
        if self.strided("post"):
            coords.update(self.decompose(text, "r", range(self.d0, self.d1), 2))
        return coords

    # -- launcher
    def launcher_head(self, leading: str = "") -> tuple[list[str], dict[str, str], str]:
        """A launcher's first lines: ``def kz_run_K(leading, a0, a1, ...)`` over the group's inputs and
        ``S``, the domain; with each input's parameter name and the output's device."""
        inputs = launcher_inputs(self.g)
        name_of = {v: f"a{j}" for j, v in enumerate(inputs)}
        pre = [name_of[e.value] for e in self.g.externals if e.phase == "pre"]
        params = ", ".join(([leading] if leading else []) + [name_of[v] for v in inputs])
        lines = [f"def kz_run_{self.k}({params}):"]
        lines.append(f"    S = tuple(torch.broadcast_shapes({', '.join(p + '.shape' for p in pre)}))")
        return lines, name_of, f"{pre[0]}.device"

    def launcher(self) -> list[str]:
        lines, name_of, device = self.launcher_head()
        dtype = f"torch.{self.g.dtype}"
        red = self.reduction
        if isinstance(red, Reduce):
            kept = f"[1] * {self.d1 - self.d0}" if red.keepdim else "[]"
            lines.append(f"    out_shape = (*S[:{self.d0}], *{kept}, *S[{self.d1}:])")
        else:
            lines.append("    out_shape = S")
        lines.append(f"    out = torch.empty(out_shape, device={device}, dtype={dtype})")
        pointers, strides = self.external_args(lines, name_of)
        args = ["out", *pointers]
        if red is None:
            lines.append("    n = out.numel()")
            lines.append("    BLOCK = min(1024, max(16, triton.next_power_of_2(n)))")
            args += ["n", "*S", *strides]
            lines.append(f"    kz_kernel_{self.k}[(triton.cdiv(n, BLOCK),)]({', '.join(args)}, BLOCK=BLOCK, num_warps=4)")
        else:
            lines.append(
                f"    OUTER, R, INNER = math.prod(S[:{self.d0}]), math.prod(S[{self.d0}:{self.d1}]), math.prod(S[{self.d1}:])"
            )
            lines.append("    if out.numel() == 0:")
            lines.append("        return out")
            if self.rows_layout:  # R may be 0 (a sum over an empty range is 0, a mean nan): tiles of one
                lines.append(f"    BLOCK_R = min(triton.next_power_of_2(max(R, 1)), {TILE})")
                lines.append(f"    BLOCK_M = min(triton.next_power_of_2(OUTER), max(1, {TILE} // BLOCK_R))")
            else:
                lines.append("    BLOCK_M = min(triton.next_power_of_2(INNER), 128)")
                lines.append(f"    BLOCK_R = min(triton.next_power_of_2(max(R, 1)), max(1, {TILE} // BLOCK_M))")
            lines.append(f"    grid = {self.rows_grid()}")
            sizes = ["OUTER", "R", "INNER"]
            lines.append("    warps = 8 if BLOCK_M * BLOCK_R >= 2048 else 4")
            if red.kind not in NEUTRAL:
                args += [*sizes, "*S", *strides]
                lines.append(
                    f"    kz_kernel_{self.k}[grid]({', '.join(args)}, BLOCK_M=BLOCK_M, BLOCK_R=BLOCK_R, num_warps=warps)"
                )
            else:
                lines.append("    SPLIT, CHUNK = _kz_split(R, BLOCK_R, math.prod(grid))")
                lines.append(
                    f"    part = out if SPLIT == 1 else torch.empty((OUTER * INNER, SPLIT), device={device}, dtype=torch.float32)"
                )
                main = [*args, "part", *sizes, "CHUNK", "SPLIT", "*S", *strides]
                lines.append(
                    f"    kz_kernel_{self.k}[(*grid, SPLIT)]({', '.join(main)}, BLOCK_M=BLOCK_M, BLOCK_R=BLOCK_R, "
                    "PARTIAL=SPLIT > 1, num_warps=warps)"
                )
                lines.append("    if SPLIT > 1:")
                lines.append("        BLOCK_S = triton.next_power_of_2(SPLIT)")
                rows = "OUTER" if self.rows_layout else "INNER"
                lines.append(f"        BLOCK_M = min(triton.next_power_of_2({rows}), max(1, {TILE} // BLOCK_S))")
                finish = [*args, "part", *sizes, "SPLIT", "*S", *strides]
                lines.append(
                    f"        kz_kernel_{self.k}_finish[{self.rows_grid()}]({', '.join(finish)}, "
                    "BLOCK_M=BLOCK_M, BLOCK_S=BLOCK_S, num_warps=4)"
                )
        lines.append("    return out")
        return lines

    def external_args(self, lines: list[str], name_of: dict[str, str]) -> tuple[list[str], list[str]]:
        """Launcher lines making each external a kernel argument: flat ones made contiguous, broadcast
        ones passed with their strides over the domain; (pointers, strides) to pass."""
        red = self.reduction
        pointers, strides = [], []
        for k, e in enumerate(self.g.externals):
            a = name_of[e.value]
            if self.flat(e):
                lines.append(f"    c{k} = {a}.contiguous()")
                pointers.append(f"c{k}")
                continue
            pointers.append(a)
            if e.phase == "pre" or not self.reshapes:
                lines.append(f"    st{k} = list({a}.expand(S).stride())")
            else:
                lines.append(f"    st{k} = list({a}.expand(out_shape).stride())")
                if isinstance(red, Reduce) and not red.keepdim:
                    lines.append(f"    st{k}[{self.d0}:{self.d0}] = [0] * {self.d1 - self.d0}")
            strides.append(f"*st{k}")
        return pointers, strides

    def rows_grid(self) -> str:
        """The launch grid over the output rows, for the launcher's BLOCK_M."""
        return "(triton.cdiv(OUTER, BLOCK_M),)" if self.rows_layout else "(OUTER, triton.cdiv(INNER, BLOCK_M))"

    def source(self) -> str:
        if isinstance(self.reduction, Norm):
            kernel, launcher = norm_kernel(self, KernelText()), norm_launcher(self)
        elif isinstance(self.reduction, Pool):
            kernel, launcher = pool_kernel(self, KernelText()), pool_launcher(self)
        else:
            kernel = self.pointwise_kernel() if self.reduction is None else self.reduction_kernel()
            launcher = self.launcher()
        return "\n".join(kernel) + "\n\n\n" + "\n".join(launcher) + "\n"


def generate_source(reference: str, plan: Plan) -> str:
    if not plan.groups:
        raise Declined("nothing to fuse")
    parts = [
        reference.rstrip() + "\n\n",
        f"# ---- ModelNew: written by the KernelZero template generator ({VERSION}), not a language model ----\n",
        "import math\nimport operator\n\nimport torch\nimport triton\nimport triton.language as tl\n\n",
        HELPERS.strip() + "\n\n",
    ]
    for group in plan.groups:
        parts.append("\n" + KernelWriter(group, plan.graph).source() + "\n")
    parts.append("\n" + forward_source(plan))
    return "".join(parts)
