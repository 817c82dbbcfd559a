"""The kernel and launcher of a pooling group: max or average pooling over the last 1 to 3 dims,
with the pointwise chain before it fused into its loads and the chain after it into its store.

One lane per output element walks its window tap by tap, row-major as PyTorch does, loading the
input where the tap falls inside it and running the pre-pool chain there. Max pooling keeps the
first largest value or the first NaN, PyTorch's own comparison, so it matches bit for bit; taps in
the padding are -inf. Average pooling sums the taps inside the input and divides by PyTorch's
divisor: the override, else the window clipped to the padded input (count_include_pad) or to the
input. The launcher sizes the output with PyTorch's formula, where ceil_mode drops a last window
that would start in the right padding. An adaptive pool whose output size divides its input is the
pool whose window and stride are that quotient, computed at run time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from coder_svc.template.lowering import Pool
from coder_svc.template.triton_ops import literal

if TYPE_CHECKING:
    from coder_svc.template.codegen import KernelText, KernelWriter

WINDOW = ("K", "ST", "P", "DL")  # per pooled dim, the kernel's constants: size, stride, padding, dilation
NEUTRAL = {"max_pool": "float('-inf')", "avg_pool": "0.0"}  # also what a tap in the padding adds


def _pool(writer: KernelWriter) -> Pool:
    assert isinstance(writer.reduction, Pool), "only a pooling group writes this part"
    return writer.reduction


def pool_kernel(writer: KernelWriter, text: KernelText) -> list[str]:
    """The group's @triton.jit kernel, written into ``text`` (empty)."""
    pool = _pool(writer)
    lead = writer.rank - pool.dims
    dims = range(pool.dims)
    text.add("@triton.jit", 0)
    text.add(writer.signature(["n", *(f"O{i}" for i in dims)], [f"{c}{i}" for i in dims for c in WINDOW] + ["BLOCK"]), 0)
    pid = "tl.program_id(0).to(tl.int64)" if writer.wide else "tl.program_id(0)"
    text.add(f"offs = {pid} * BLOCK + tl.arange(0, BLOCK)")
    text.add("mask = offs < n")
    # the lane's output coordinates and window starts; what is left of offs indexes the leading dims
    text.add("rest = offs")
    for i in reversed(dims):
        text.add(f"out{i} = rest % O{i}")
        text.add(f"rest = rest // O{i}")
        text.add(f"start{i} = out{i} * ST{i} - P{i}")
    coords = writer.decompose(text, "rest", range(lead), 1) if writer.strided("pre") or writer.strided("post") else {}
    text.add(f"acc = tl.full([BLOCK], {NEUTRAL[pool.kind]}, tl.float32)")
    valid, offset, depth = "mask", "rest", 1
    for i in dims:
        d = lead + i
        text.add(f"for k{i} in range(K{i}):", depth)
        depth += 1
        text.add(f"at{i} = start{i} + k{i} * DL{i}", depth)
        text.add(f"ok{i} = {valid} & (at{i} >= 0) & (at{i} < S{d})", depth)
        text.add(f"row{i} = {offset} * S{d} + at{i}", depth)
        valid, offset = f"ok{i}", f"row{i}"
    env = writer.load_phase(text, "pre", offset, valid, {**coords, **{lead + i: f"at{i}" for i in dims}}, None, None, depth)
    writer.emit_ops(text, writer.g.pre, env, depth)
    v = env[pool.source]
    if pool.kind == "max_pool":
        text.add(f"acc = tl.where({valid} & (({v} > acc) | ({v} != {v})), {v}, acc)", depth)
    else:
        text.add(f"acc += tl.where({valid}, {v}, 0.0)", depth)
        if pool.divisor is not None:
            divisor = literal(pool.divisor)
        elif pool.count_include_pad:
            divisor = " * ".join(f"(tl.minimum(start{i} + K{i}, S{lead + i} + P{i}) - start{i})" for i in dims)
        else:
            divisor = " * ".join(f"(tl.minimum(start{i} + K{i}, S{lead + i}) - tl.maximum(start{i}, 0))" for i in dims)
        text.add(f"acc = acc / ({divisor})")
    env = {writer.reduced_name: "acc"}
    env.update(writer.load_phase(text, "post", "offs", "mask", {**coords, **{lead + i: f"out{i}" for i in dims}}, None, None, 1))
    writer.emit_ops(text, writer.g.post, env, 1)
    text.add(f"tl.store(out_ptr + offs, {env[writer.g.head]}.to(out_ptr.dtype.element_ty), mask=mask)")
    return text.lines


def pool_launcher(writer: KernelWriter) -> list[str]:
    """``kz_run_K(inputs...)``: the output's size from the input's, then one lane per output element."""
    pool = _pool(writer)
    lead = writer.rank - pool.dims
    lines, name_of, device = writer.launcher_head()
    lines.append(f"    X = S[{lead}:]")
    if pool.output_size is None:
        lines.append(f"    K, ST, P, DL = {pool.kernel}, {pool.stride}, {pool.padding}, {pool.dilation}")
        up = " + s - 1" if pool.ceil_mode else ""
        lines.append(f"    O = [(x + 2 * p - d * (k - 1) - 1{up}) // s + 1 for x, k, s, p, d in zip(X, K, ST, P, DL)]")
        if pool.ceil_mode:  # as PyTorch: the last window starts inside the input or its left padding
            lines.append("    O = [o - ((o - 1) * s >= x + p) for o, x, s, p in zip(O, X, ST, P)]")
    else:
        lines.append(f"    O = [x if o is None else o for x, o in zip(X, {pool.output_size})]")
        lines.append("    if any(x % o for x, o in zip(X, O)):")
        lines.append("        raise ValueError(f'adaptive pool of {X} to {O}: this kernel computes only equal windows')")
        lines.append("    K = ST = [x // o for x, o in zip(X, O)]")
        lines.append(f"    P, DL = {(0,) * pool.dims}, {(1,) * pool.dims}")
    lines.append(f"    out_shape = (*S[:{lead}], *O)")
    lines.append(f"    out = torch.empty(out_shape, device={device}, dtype=torch.{writer.g.dtype})")
    pointers, strides = writer.external_args(lines, name_of)
    lines.append("    n = out.numel()")
    lines.append("    if n == 0:")
    lines.append("        return out")
    lines.append("    BLOCK = min(256, max(16, triton.next_power_of_2(n)))")
    window = ", ".join(f"{c}{i}={c}[{i}]" for i in range(pool.dims) for c in WINDOW)
    args = ", ".join(["out", *pointers, "n", "*O", "*S", *strides])
    lines.append(f"    kz_kernel_{writer.k}[(triton.cdiv(n, BLOCK),)]({args}, {window}, BLOCK=BLOCK, num_warps=4)")
    lines.append("    return out")
    return lines
