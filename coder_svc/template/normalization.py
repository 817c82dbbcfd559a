"""The kernel and launcher of a normalisation group: batch, instance or group norm, with the
pointwise chains before and after it fused in.

Every norm is the same kernel over the input viewed as (A, B, D): one statistic per B index,
reduced over A and D. Batch norm: (N, C, spatial), per channel; instance norm: (1, N*C, spatial),
per sample and channel; group norm: (1, N*G, C/G*spatial), per sample and group. A program owns
BLOCK_B statistics and walks their A*D elements in tiles: the mean, the biased variance (two passes,
as stable as PyTorch's), then normalise, affine, the post chain and the store. Statistics that are
not the batch's (batch norm in eval mode) are the running ones the launcher passes instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from coder_svc.template.lowering import Norm

if TYPE_CHECKING:
    from coder_svc.template.codegen import KernelText, KernelWriter

# The launcher's (A, B, D) view and its affine indexing: channel = (b % BC) * CPB + d // DS.
VIEWS = {
    "batch_norm": [
        "    A, B, D = S[0], S[1], math.prod(S[2:])",
        "    BC, CPB, DS = B, 1, D",
    ],
    "instance_norm": [
        "    A, B, D = 1, S[0] * S[1], math.prod(S[2:])",
        "    BC, CPB, DS = S[1], 1, D",
    ],
    "group_norm": [
        "    G = m.num_groups",
        "    A, B, D = 1, S[0] * G, S[1] // G * math.prod(S[2:])",
        "    BC, CPB, DS = G, S[1] // G, math.prod(S[2:])",
    ],
}
EXTRA_ARGS = ["stat_ptr", "w_ptr", "bias_ptr", "A", "B", "D", "BC", "CPB", "DS", "eps"]


def _norm(writer: KernelWriter) -> Norm:
    assert isinstance(writer.reduction, Norm), "only a normalisation group writes this part"
    return writer.reduction


def _tile(writer: KernelWriter, text: KernelText, depth: int) -> tuple[dict[str, str], str]:
    """Inside a loop over the statistics' A*D elements: this tile's mask, flat offsets, loads and
    pre-norm chain; the values in scope (the post chain's externals too) and the norm's input."""
    cast = ".to(tl.int64)" if writer.wide else ""
    text.add(f"r = (r0 + tl.arange(0, BLOCK_R)){cast}", depth)
    text.add("mask2 = b_mask[:, None] & (r < N)[None, :]", depth)
    text.add("a = r // D", depth)
    text.add("d = r - a * D", depth)
    text.add("flat = (b * D)[:, None] + (a * (B * D) + d)[None, :]", depth)
    coords = writer.decompose(text, "flat", range(writer.rank), depth) if writer.strided("pre") or writer.strided("post") else {}
    env = writer.load_phase(text, "pre", "flat", "mask2", coords, None, None, depth)
    writer.emit_ops(text, writer.g.pre, env, depth)
    env.update(writer.load_phase(text, "post", "flat", "mask2", coords, None, None, depth))
    return env, env[_norm(writer).source]


def norm_kernel(writer: KernelWriter, text: KernelText) -> list[str]:
    """The group's @triton.jit kernel, written into ``text`` (empty): statistics unless COMPUTE is off,
    then the normalised, affine, post-chained output."""
    text.add("@triton.jit", 0)
    text.add(writer.signature(EXTRA_ARGS, ["BLOCK_B", "BLOCK_R", "COMPUTE", "AFFINE"]), 0)
    cast = ".to(tl.int64)" if writer.wide else ""
    text.add(f"b = (tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)){cast}")
    text.add("b_mask = b < B")
    text.add("N = A * D")
    loop = "for r0 in range(0, N, BLOCK_R):"
    text.add("if COMPUTE:")
    text.add("acc = tl.zeros([BLOCK_B, BLOCK_R], dtype=tl.float32)", 2)
    text.add(loop, 2)
    _, v = _tile(writer, text, 3)
    text.add(f"acc += tl.where(mask2, {v}, 0.0)", 3)
    text.add("mean = tl.sum(acc, axis=1) / N", 2)
    text.add("acc = tl.zeros([BLOCK_B, BLOCK_R], dtype=tl.float32)", 2)
    text.add(loop, 2)
    _, v = _tile(writer, text, 3)
    text.add(f"dv = tl.where(mask2, {v} - mean[:, None], 0.0)", 3)
    text.add("acc += dv * dv", 3)
    text.add("var = tl.sum(acc, axis=1) / N", 2)
    text.add("tl.store(stat_ptr + b, mean, mask=b_mask)", 2)
    text.add("tl.store(stat_ptr + B + b, var, mask=b_mask)", 2)
    text.add("else:")
    text.add("mean = tl.load(stat_ptr + b, mask=b_mask, other=0.0)", 2)
    text.add("var = tl.load(stat_ptr + B + b, mask=b_mask, other=1.0)", 2)
    text.add("invstd = 1.0 / tl.sqrt(var + eps)")
    text.add(loop)
    env, v = _tile(writer, text, 2)
    text.add(f"y = ({v} - mean[:, None]) * invstd[:, None]", 2)
    text.add("if AFFINE:", 2)
    text.add("ch = (b % BC)[:, None] * CPB + (d // DS)[None, :]", 3)
    text.add("y = y * tl.load(w_ptr + ch, mask=mask2, other=0.0) + tl.load(bias_ptr + ch, mask=mask2, other=0.0)", 3)
    env[writer.reduced_name] = "y"
    writer.emit_ops(text, writer.g.post, env, 2)
    text.add(f"tl.store(out_ptr + flat, {env[writer.g.head]}.to(out_ptr.dtype.element_ty), mask=mask2)", 2)
    return text.lines


def norm_launcher(writer: KernelWriter) -> list[str]:
    """``kz_run_K(m, inputs...)``: ``m`` is the norm module, read at run time for its mode, running
    statistics (updated in training mode), affine parameters and eps."""
    g, norm = writer.g, _norm(writer)
    lines, name_of, device = writer.launcher_head("m")
    lines.append(f"    out = torch.empty(S, device={device}, dtype=torch.{g.dtype})")
    pointers, strides = writer.external_args(lines, name_of)
    lines.append("    if out.numel() == 0:")
    lines.append("        return out")
    lines += VIEWS[norm.kind]
    if norm.kind == "batch_norm":  # batch statistics in training mode or without running ones, as F.batch_norm
        lines.append("    batch_stats = m.training or m.running_mean is None")
    else:
        lines.append("    batch_stats = True")
    lines.append("    if batch_stats:")
    lines.append(f"        stats = torch.empty(2 * B, device={device}, dtype=torch.float32)")
    lines.append("    else:")
    lines.append("        stats = torch.cat([m.running_mean, m.running_var]).to(torch.float32)")
    lines.append("    affine = m.weight is not None")
    lines.append("    weight, bias = (m.weight, m.bias) if affine else (stats, stats)")
    # D == 1 (batch norm over (N, C)): a tile's rows are neighbouring channels, so its loads coalesce
    lines.append("    BLOCK_B = min(triton.next_power_of_2(B), 32) if D == 1 else 1")
    lines.append("    BLOCK_R = min(triton.next_power_of_2(A * D), max(16, 2048 // BLOCK_B))")
    args = ["out", *pointers, "stats", "weight", "bias", "A", "B", "D", "BC", "CPB", "DS", "float(m.eps)", "*S", *strides]
    lines.append(
        f"    kz_kernel_{writer.k}[(triton.cdiv(B, BLOCK_B),)]({', '.join(args)}, BLOCK_B=BLOCK_B, BLOCK_R=BLOCK_R, "
        "COMPUTE=batch_stats, AFFINE=affine, num_warps=4)"
    )
    if norm.kind == "batch_norm":
        # training mode updates the running statistics as PyTorch does: momentum (or the cumulative
        # average when it is None) of the batch mean and of the unbiased batch variance
        lines += [
            "    if m.training and m.running_mean is not None:",
            "        m.num_batches_tracked.add_(1)",
            "        f = m.momentum if m.momentum is not None else 1.0 / m.num_batches_tracked",
            "        n = A * D",
            "        m.running_mean.mul_(1 - f).add_(stats[:B] * f)",
            "        m.running_var.mul_(1 - f).add_(stats[B:] * (f * n / max(n - 1, 1)))",
        ]
    lines.append("    return out")
    return lines
