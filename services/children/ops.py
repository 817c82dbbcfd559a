"""What PyTorch did in a child: every aten op a forward ran, the work it did by family, and where
custom kernels' results went (``OpRecorder``).

The reward harness compares a candidate's PyTorch work with the reference's (PyTorch doing the
reference's work back is no kernel), follows what custom kernels wrote (provenance) and notes the
reference's ops that act as copies on its values; the Proposer's validation hashes the op graph.
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
import weakref
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack
from typing_extensions import TypedDict  # pydantic validates it (reward_svc.protocol): typing's from Python 3.12 only

from services.children import tensors


class Work(TypedDict):
    """What PyTorch did in one call (``OpRecorder.work``): compute work by family, the part of its
    pointwise work that combined values (``combining_work``), values read into Python."""

    families: dict[str, int]
    combining: int
    host_scalars: int
    host_bytes: int


# aten operators that move, view or allocate memory; everything else computes.
_NON_COMPUTE_PREFIXES = (
    "empty",
    "new_empty",
    "zeros",
    "ones",
    "full",
    "fill",
    "zero_",
    "view",
    "_unsafe_view",
    "reshape",
    "as_strided",
    "expand",
    "permute",
    "transpose",
    "t",
    "contiguous",
    "clone",
    "copy",
    "_to_copy",
    "to",
    "detach",
    "alias",
    "slice",
    "select",
    "squeeze",
    "unsqueeze",
    "flatten",
    "unflatten",
    "split",
    "chunk",
    "narrow",
    "size",
    "stride",
    "sym_",
    "lift",
    "_local_scalar_dense",
    "item",
    "resize",
    "set_",
    "unbind",
    "is_",
    "arange",
    "_reshape_alias",
    "new_zeros",
    "new_ones",
    "new_full",
    "lift_fresh",
    "dim",
    "numel",
    "record_stream",
    "_has_compatible_shallow_copy_type",
    "_unsafe_index",
    "stack",
    "cat",
)
ATEN_NAMESPACES = frozenset({"aten", "prims"})
# Compute ops by the kind of work they do. PyTorch rewrites one op as others (relu as clamp_min, a
# softmax as exp/sum/div, einsum as bmm, a matmul as a broadcast multiply and a sum), but rarely
# across these kinds, so the accounting compares work per family, not per name.
CONTRACTION_OPS = frozenset(
    {
        "mkldnn_linear",  # F.linear on oneDNN tensors
        "_addmm_activation",
        "mm",
        "bmm",
        "addmm",
        "addbmm",
        "baddbmm",
        "matmul",
        "mv",
        "addmv",
        "dot",
        "vdot",
        "addr",
        "outer",
        "ger",
        "linear",
        "einsum",
        "tensordot",
        "bilinear",
        "_trilinear",
        "kron",
        "convolution",
        "_convolution",
        "conv1d",
        "conv2d",
        "conv3d",
        "conv_transpose1d",
        "conv_transpose2d",
        "conv_transpose3d",
        "cudnn_convolution",
        "cudnn_convolution_transpose",
        "mkldnn_convolution",
        "_convolution_mode",
        "conv_tbc",
        "slow_conv3d_forward",
        "_slow_conv2d_forward",
        "slow_conv_transpose2d",
        "slow_conv_transpose3d",
        "_scaled_mm",
        "_int_mm",
        "cdist",
        "_cdist_forward",
        "scaled_dot_product_attention",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_efficient_attention_forward",
        "_flash_attention_forward",
        "_scaled_dot_product_attention_math",
        "embedding_bag",
        "_embedding_bag",
        "_embedding_bag_forward_only",
    }
)
REDUCTION_OPS = frozenset(
    {
        "sum",
        "mean",
        "prod",
        "amax",
        "amin",
        "max",
        "min",
        "argmax",
        "argmin",
        "aminmax",
        "var",
        "std",
        "var_mean",
        "std_mean",
        "norm",
        "linalg_vector_norm",
        "linalg_matrix_norm",
        "frobenius_norm",
        "nuclear_norm",
        "logsumexp",
        "_softmax",
        "softmax",
        "_log_softmax",
        "log_softmax",
        "_safe_softmax",
        "all",
        "any",
        "count_nonzero",
        "nansum",
        "nanmean",
        "native_layer_norm",
        "native_group_norm",
        "native_batch_norm",
        "_native_batch_norm_legit",
        "_native_batch_norm_legit_no_training",
        "batch_norm",
        "_batch_norm_impl_index",
        "cudnn_batch_norm",
        "layer_norm",
        "group_norm",
        "instance_norm",
        "rms_norm",
        "_fused_rms_norm",
        "max_pool1d",
        "max_pool2d",
        "max_pool3d",
        "max_pool1d_with_indices",
        "max_pool2d_with_indices",
        "max_pool3d_with_indices",
        "avg_pool1d",
        "avg_pool2d",
        "avg_pool3d",
        "adaptive_avg_pool1d",
        "adaptive_avg_pool2d",
        "adaptive_avg_pool3d",
        "_adaptive_avg_pool2d",
        "_adaptive_avg_pool3d",
        "adaptive_max_pool1d",
        "adaptive_max_pool2d",
        "adaptive_max_pool3d",
        "fractional_max_pool2d",
        "fractional_max_pool3d",
        "mse_loss",
        "l1_loss",
        "smooth_l1_loss",
        "huber_loss",
        "nll_loss_forward",
        "nll_loss2d_forward",
        "nll_loss",
        "nll_loss_nd",
        "cross_entropy_loss",
        "kl_div",
        "binary_cross_entropy",
        "binary_cross_entropy_with_logits",
        "soft_margin_loss",
        "multilabel_margin_loss_forward",
        "multi_margin_loss",
        "dist",
        "renorm",
        "histc",
        "mkldnn_max_pool2d",
        "mkldnn_max_pool3d",
        "mkldnn_adaptive_avg_pool2d",
        "_masked_softmax",
        "bincount",
        "histogram",
        "_histogramdd_from_bin_cts",
        "_histogramdd_from_bin_tensors",
        "embedding_renorm",  # each looked-up row's norm, and the rows scaled by it
        "_weight_norm_interface",
        "cosine_similarity",
        "_pdist_forward",
        "trace",
    }
)
DATA_OPS = frozenset(
    {
        "gather",
        "scatter",
        "index_select",
        "index",
        "index_put",
        "index_copy",
        "take",
        "take_along_dim",
        "masked_select",
        "masked_scatter",
        "embedding",
        "nonzero",
        "flip",
        "roll",
        "repeat",
        "tile",
        "repeat_interleave",
        "im2col",
        "unfold",
        "constant_pad_nd",
        "reflection_pad1d",
        "reflection_pad2d",
        "reflection_pad3d",
        "replication_pad1d",
        "replication_pad2d",
        "replication_pad3d",
        "upsample_nearest1d",
        "upsample_nearest2d",
        "upsample_nearest3d",
        "upsample_bilinear2d",
        "upsample_linear1d",
        "upsample_trilinear3d",
        "upsample_bicubic2d",
        "grid_sampler_2d",
        "grid_sampler_3d",
        "diag",
        "tril",
        "triu",
        "pixel_shuffle",
        "pixel_unshuffle",
        "channel_shuffle",
    }
)
# The key under which ``op_work`` reports the part of a pointwise op's work that folded values together
# (``_combined``): not a family, what of the pointwise family can stand for a reduction or a contraction.
COMBINING = "combining"
ELEMENTWISE_OVERLOADS = frozenset({"other", "binary_out"})  # max(a, b) and min(a, b): pointwise, not reductions
# Reductions that keep their input's size (a sort, a scan, a search among boundaries): reductions
# whatever the sizes, never pointwise work in disguise.
SCAN_OPS = frozenset(
    {
        # reductions whose results can be made as large as their input (the dynamic program's table, a
        # resize that also grows the other dimension), so no result size may turn them into pointwise work
        "_ctc_loss",
        "ctc_loss",
        "_upsample_bilinear2d_aa",
        "_upsample_bicubic2d_aa",
        "_upsample_lanczos2d_aa",
        "unique",  # sorted uniques are a sort
        "_unique",
        "_unique2",
        "unique_dim",
        "unique_consecutive",
        "unique_dim_consecutive",
        "sort",
        "argsort",
        "msort",
        "topk",
        "kthvalue",
        "median",
        "nanmedian",
        "mode",
        "cumsum",
        "cumprod",
        "cummax",
        "cummin",
        "logcumsumexp",
        "_cummax_helper",
        "_cummin_helper",
        "searchsorted",
        "bucketize",
    }
)
# Matrix functions (a matrix exponential is matmuls; a solve, an inverse, a factorisation, an FFT):
# contractions, whatever their names.
MATRIX_FUNCTIONS = frozenset(
    {
        "matrix_exp",
        "matrix_power",
        "cholesky",
        "cholesky_solve",
        "cholesky_inverse",
        "inverse",
        "det",
        "logdet",
        "slogdet",
        "svd",
        "qr",
        "geqrf",
        "orgqr",
        "ormqr",
        "lu_unpack",
        "lu_solve",
        "triangular_solve",
        "pinverse",
        "chain_matmul",
        "lstsq",
        "symeig",
        "eig",
    }
)
MATRIX_FUNCTION_PREFIXES = ("linalg_", "_linalg_", "fft_", "_fft_")


def is_compute_op(name: str) -> bool:
    return not any(
        name == p or name.startswith(p + ".") or name.startswith(p + "_") or name == p.rstrip("_") for p in _NON_COMPUTE_PREFIXES
    )


# Ops that are several passes of work in one: their work per element read, split by family, so a
# PyTorch decomposition of one (a softmax as amax, sub, exp, sum, div) weighs what the op does, and
# PyTorch doing one pass of it (the row maxima before a kernel) weighs that pass only.
COMPOSITE_WORK = {
    **dict.fromkeys(
        ("softmax", "_softmax", "_safe_softmax", "log_softmax", "_log_softmax", "logsumexp"), {"reduction": 2, "pointwise": 3}
    ),
    **dict.fromkeys(
        (
            "native_layer_norm",
            "layer_norm",
            "native_group_norm",
            "group_norm",
            "instance_norm",
            "native_batch_norm",
            "_native_batch_norm_legit",
            "batch_norm",
            "_batch_norm_impl_index",
            "cudnn_batch_norm",
        ),
        {"reduction": 2, "pointwise": 4},
    ),
    "_native_batch_norm_legit_no_training": {"pointwise": 4},  # running statistics: no reduction
    **dict.fromkeys(("rms_norm", "_fused_rms_norm"), {"reduction": 1, "pointwise": 3}),
    **dict.fromkeys(("var", "std", "var_mean", "std_mean"), {"reduction": 2, "pointwise": 1}),
    **dict.fromkeys(
        ("norm", "linalg_vector_norm", "frobenius_norm", "dist", "renorm", "embedding_renorm"), {"reduction": 1, "pointwise": 1}
    ),
    **dict.fromkeys(("mse_loss", "l1_loss"), {"reduction": 1, "pointwise": 2}),
    **dict.fromkeys(
        ("smooth_l1_loss", "huber_loss", "kl_div", "soft_margin_loss", "multi_margin_loss"), {"reduction": 1, "pointwise": 3}
    ),
    **dict.fromkeys(("binary_cross_entropy", "binary_cross_entropy_with_logits"), {"reduction": 1, "pointwise": 4}),
    **dict.fromkeys(("cosine_similarity", "cross_entropy_loss"), {"reduction": 3, "pointwise": 3}),
}
POINTWISE_WEIGHT = {  # operations per result element of activations that are one op in aten and several spelled out
    "gelu": 4,
    "mish": 4,
    "softplus": 3,
    "log_sigmoid_forward": 3,
    "hardswish": 3,
    "silu": 2,
    "elu": 2,
    "selu": 2,
    "celu": 2,
    "sigmoid": 2,
    "tanh": 2,
    "erf": 2,
    "hardsigmoid": 2,
    "softshrink": 2,
    "hardshrink": 2,
    "addcdiv": 2,
    "lerp": 2,
}
SMALL_EXTENT = (
    4  # a contraction over at most this many terms, or a reduction of at most this many values into one, is pointwise work
)


# Data ops that sum, multiply or take extremes as they place values: reductions under a data op's name
# (a row sum as index_add, a ReLU as scatter_reduce with amax); index_put is one when it accumulates.
ACCUMULATING_OPS = frozenset(
    {
        "scatter_add",
        "scatter_reduce",
        "index_add",
        "index_reduce",
        "segment_reduce",
        "_segment_reduce",
        "put",
        "col2im",  # fold: overlapping patches summed
    }
)
# ``scatter`` with ``reduce=`` ("add", "multiply"): its overloads say so
ACCUMULATING_OVERLOADS = frozenset({"reduce", "value_reduce", "reduce_out", "value_reduce_out"})
ACCUMULATING_WHEN_ASKED = frozenset({"index_put", "_index_put_impl", "put"})
SPARSE_CONTRACTIONS = frozenset({"_sparse_mm", "_sparse_addmm", "sspaddmm", "hspmm", "_sparse_sparse_matmul", "smm", "spmm"})
SPARSE_REDUCTIONS = frozenset(
    {
        "_sparse_sum",
        "_sparse_softmax",
        "_sparse_log_softmax",
        "_sparse_csr_sum",
        "_sparse_csr_prod",
        "_to_dense",
        "to_dense",
        "coalesce",
        "_coalesce",
    }  # densifying or coalescing sums duplicate entries
)
ATTENTION = frozenset(
    {
        "scaled_dot_product_attention",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_efficient_attention_forward",
        "_flash_attention_forward",
        "_scaled_dot_product_attention_math",
        "_scaled_dot_product_fused_attention_overrideable",
    }
)
# Library ops that do several families' work in one: each of their products also a subtraction or an
# absolute value, and a sum (pairwise distances)
MULTI_FAMILY = {
    name: ("contraction", "pointwise", "reduction")
    for name in ("cdist", "_cdist_forward", "_euclidean_dist", "pdist", "_pdist_forward")
}
# Factories whose values no tensor's data decides (their sizes only): what PyTorch computes from them
# alone is index bookkeeping (an element's channel, a causal mask), not the reference's work. Not
# ``empty``: its memory may hold what a freed tensor held.
DATA_FREE_FACTORIES = frozenset(
    {
        "zeros",
        "zeros_like",
        "new_zeros",
        "ones",
        "ones_like",
        "new_ones",
        "full",
        "full_like",
        "new_full",
        "arange",
        "range",
        "linspace",
        "logspace",
        "eye",
        "tril_indices",
        "triu_indices",
        "scalar_tensor",
    }
)
# Of those, the ones whose tensor argument is a template of shape and dtype only; the others take their
# values from a tensor they are handed (``linspace(x[0], x[1], 2)``) and are data-free only if it is.
SHAPE_TEMPLATE_FACTORIES = frozenset({"zeros_like", "new_zeros", "ones_like", "new_ones", "full_like", "new_full"})


# Whole layers that PyTorch runs as one op (recurrent layers and cells, the fast paths of
# ``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer``): weighed as the layer written out
# (``_fused_layer_work``).
FUSED_LAYERS = {  # op -> the positions of its weight matrices (a list of them, for cuDNN's and MIOpen's)
    "mkldnn_rnn_layer": (1, 2),
    "_cudnn_rnn": (1,),
    "miopen_rnn": (1,),
    "_native_multi_head_attention": (5, 7),
    "_transformer_encoder_layer_fwd": (3, 5, 14, 16),
}
ATTENTION_LAYERS = {"_native_multi_head_attention": 4, "_transformer_encoder_layer_fwd": 2}  # where num_heads is


def is_convolution(name: str) -> bool:
    """A convolution under any backend's name (``cudnn_convolution_relu``, ``_conv_depthwise2d``, ``conv_tbc``)."""
    return (
        name in CONVOLUTIONS
        or "convolution" in name
        or name.startswith(("conv1d", "conv2d", "conv3d", "conv_", "_conv_", "slow_conv", "thnn_conv"))
    )


def op_family(name: str, accumulate: bool = False, overload: str = "") -> str:
    """The family of an aten compute op (in-place ``scatter_`` is ``scatter``'s): contraction,
    reduction, data or pointwise."""
    base = name[:-1] if name.endswith("_") and not name.endswith("__") else name
    if base in DATA_OPS and overload in ACCUMULATING_OVERLOADS:
        return "reduction"
    if base in REDUCTION_OPS or base in SCAN_OPS or base in ACCUMULATING_OPS or base in SPARSE_REDUCTIONS:
        return "reduction"
    if accumulate and base in ACCUMULATING_WHEN_ASKED:
        return "reduction"
    if (
        base in CONTRACTION_OPS
        or is_convolution(base)
        or base in MATRIX_FUNCTIONS
        or base in SPARSE_CONTRACTIONS
        or base.startswith(MATRIX_FUNCTION_PREFIXES)
    ):
        return "contraction"
    return "data" if base in DATA_OPS else "pointwise"


def op_work(
    name: str,
    overload: str,
    inputs: list[torch.Tensor],
    outputs: list[torch.Tensor],
    accumulate: bool = False,
    scalars: int = 0,
    arguments: Sequence[object] = (),
) -> dict[str, int]:
    """The work one aten compute op did, by family (and, under ``COMBINING``, what of its pointwise work
    folded values together). Contractions, reductions and data ops: the
    elements they read (a composite op: split by family, ``COMPOSITE_WORK``). A pointwise op: its
    result's elements times the operations that make each (one per operand past the first, a number
    among its arguments, ``scalars``, one too, at least one; an activation's own weight), so
    ``addcmul`` weighs what ``mul`` and ``add`` do, ``add(x, 1, alpha=0.5)`` a multiply and an add. A
    contraction over at most ``SMALL_EXTENT`` terms (a matmul with an inner size of 1) and a reduction
    of at most that many values into each result are pointwise work in disguise; a pointwise op that
    broadcasts its inputs into a larger result (an outer product spelled ``a[:, :, None] * b``) is a
    contraction of that result's size. On complex values a product is four real ones, a pointwise
    operation two."""
    base = name[:-1] if name.endswith("_") and not name.endswith("__") else name
    family = op_family(name, accumulate, overload)
    work = _op_work(base, family, overload, inputs, outputs, scalars)
    if base in FUSED_LAYERS:
        work = _fused_layer_work(base, inputs, arguments) or work
    elif base in ATTENTION:
        work = _attention_work(inputs) or work
    elif base in MULTI_FAMILY:
        products = _multiply_adds(base, inputs, max((t.numel() for t in outputs), default=0))
        work = {f: max(products, *work.values()) for f in MULTI_FAMILY[base]}
    if any(t.is_complex() for t in inputs):
        return {f: w * (4 if f == "contraction" else 2) for f, w in work.items()}
    return work


def _combined(inputs: list[torch.Tensor], produced: int) -> int:
    """How many values a pointwise op folded into others: the distinct values its operands hold past
    the ones its result holds (``a + b``: one per result; ``x[:, ::2] + x[:, 1::2]``, one level of a tree
    sum: half its input; ``-x`` or ``x + bias``: none, or the bias's). Only such work can stand for a
    reduction's or a contraction's; an activation or a negation of the input cannot."""
    return max(0, sum(_distinct(t) for t in inputs if t.numel() > 1) - produced)


def _distinct(t: torch.Tensor) -> int:
    """The values a (possibly broadcast) tensor holds: its size along the dimensions it does not repeat."""
    if t.layout != torch.strided:
        return _elements(t)
    return math.prod(size for size, stride in zip(t.shape, t.stride()) if stride != 0)


def _elements(t: torch.Tensor) -> int:
    """The values a tensor holds: a sparse one's stored values, not its dense size."""
    if t.layout != torch.strided:
        try:
            return int(t._values().numel())
        except (RuntimeError, NotImplementedError):  # a layout with no such view (mkldnn): its dense size
            return t.numel()
    return t.numel()


def _attention_work(inputs: list[torch.Tensor]) -> dict[str, int] | None:
    """A fused attention's work: its two matmuls (queries by keys, weights by values) and a softmax
    over every score, as the same attention written out weighs."""
    if len(inputs) < 3 or min(t.dim() for t in inputs[:3]) < 2:
        return None
    query, key, value = inputs[:3]
    scores = query.numel() // max(1, query.shape[-1]) * key.shape[-2]
    return {
        "contraction": scores * (query.shape[-1] + value.shape[-1]),
        **{family: scores * factor for family, factor in COMPOSITE_WORK["softmax"].items()},
    }


def _fused_layer_work(base: str, inputs: list[torch.Tensor], arguments: Sequence[object]) -> dict[str, int] | None:
    """A fused layer's work, as the same layer written out weighs: its weight matrices (found by their
    argument positions, not by shape: states and masks are matrices too) applied to every row of its
    first input (a time step, a token); a recurrent layer's gate arithmetic; attention's scores, their
    softmax and the weighted values, over every head; a transformer layer's norms, feed-forward
    activation and residuals."""
    weights: list[torch.Tensor] = []
    for position in FUSED_LAYERS[base]:
        value = arguments[position] if len(arguments) > position else None
        for t in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(t, torch.Tensor) and t.dim() == 2:
                weights.append(t)
    if not inputs or inputs[0].dim() < 2 or not weights:
        return None
    rows = inputs[0].numel() // max(1, inputs[0].shape[-1])
    contraction = rows * sum(t.numel() for t in weights)
    if base not in ATTENTION_LAYERS:  # recurrent: the sum, activation and products of each gate pre-activation
        return {"contraction": contraction, "pointwise": rows * weights[0].shape[0] * 9 // 2}
    heads_at = ATTENTION_LAYERS[base]
    given = arguments[heads_at] if len(arguments) > heads_at else None
    heads = given if isinstance(given, int) else 1
    width, length = inputs[0].shape[-1], inputs[0].shape[-2]
    keys = inputs[1].shape[-2] if base == "_native_multi_head_attention" and inputs[1].dim() >= 2 else length
    scores = rows * keys * heads
    work = {
        "contraction": contraction + 2 * rows * keys * width,  # queries by keys, weights by values
        "pointwise": scores * (COMPOSITE_WORK["softmax"]["pointwise"] + 1),  # and the scale
        "reduction": scores * COMPOSITE_WORK["softmax"]["reduction"],
    }
    if base == "_transformer_encoder_layer_fwd":  # two norms and two residuals over the width, the activation
        feed_forward = weights[2].shape[0] if len(weights) > 2 else width
        work["pointwise"] += rows * (width * 2 * (COMPOSITE_WORK["native_layer_norm"]["pointwise"] + 1) + feed_forward)
        work["reduction"] += rows * width * 2 * COMPOSITE_WORK["native_layer_norm"]["reduction"]
    return work


def _op_work(
    base: str, family: str, overload: str, inputs: list[torch.Tensor], outputs: list[torch.Tensor], scalars: int = 0
) -> dict[str, int]:
    read = sum(_elements(t) for t in inputs)
    produced = max((t.numel() for t in outputs), default=0)
    if family == "reduction" and overload in ELEMENTWISE_OVERLOADS:
        family = "pointwise"
    if family == "contraction":
        extent = _contracted_extent(base, inputs)
        if extent is not None and extent <= SMALL_EXTENT:  # its products, and the added term of addmm and kin
            folds = produced * (extent + base.startswith(("add", "baddbmm")))
            return {"pointwise": folds, COMBINING: folds}
        return {"contraction": _multiply_adds(base, inputs, produced)}
    if family == "reduction":
        if (
            produced
            and max((_elements(t) for t in inputs), default=0) <= SMALL_EXTENT * produced
            and base not in COMPOSITE_WORK
            and base not in SCAN_OPS
        ):
            return {"pointwise": read, COMBINING: _combined(inputs, produced)}
        return {family: read * factor for family, factor in COMPOSITE_WORK.get(base, {"reduction": 1}).items()}
    if family == "data":
        return {"data": read}
    if inputs and produced > max(t.numel() for t in inputs):
        return {"contraction": produced}
    operands = len(inputs) + scalars
    return {"pointwise": produced * max(1, operands - 1, POINTWISE_WEIGHT.get(base, 1)), COMBINING: _combined(inputs, produced)}


MATMULS = frozenset({"mm", "bmm", "matmul", "addmm", "addbmm", "baddbmm"})
VECTOR_PRODUCTS = frozenset({"mv", "addmv", "dot", "vdot"})
CONVOLUTIONS = frozenset(
    {
        "convolution",
        "_convolution",
        "conv1d",
        "conv2d",
        "conv3d",
        "cudnn_convolution",
        "mkldnn_convolution",
        "_convolution_mode",
        "conv_transpose1d",
        "conv_transpose2d",
        "conv_transpose3d",
        "cudnn_convolution_transpose",
        "slow_conv3d_forward",
        "_slow_conv2d_forward",
        "slow_conv_transpose2d",
        "slow_conv_transpose3d",
    }
)


def _multiply_adds(name: str, inputs: list[torch.Tensor], produced: int) -> int:
    """A contraction's work: the products it sums (a matmul's M·N·K, a convolution's outputs times the
    terms each sums, an embedding bag's looked-up values), so a cheap pass over its operands (their
    sums, say) never weighs what the contraction does; a matrix function (an exponential, a solve) as
    a matmul of its operand by itself; others as their results times what each sums over."""
    operands = inputs[1:] if name.startswith(("add", "baddbmm")) else inputs
    if name == "linear" and len(inputs) > 1:
        return inputs[0].numel() * inputs[1].shape[0]
    if name in MATMULS and len(operands) > 1:
        return operands[0].numel() * (operands[1].shape[-1] if operands[1].dim() > 1 else 1)
    if name in VECTOR_PRODUCTS and operands:
        return operands[0].numel()
    if name == "conv_tbc" and len(inputs) > 1 and inputs[1].dim() == 3:  # weight (width, in, out)
        return produced * (inputs[1].numel() // max(1, inputs[1].shape[-1]))
    if is_convolution(name) and len(inputs) > 1 and inputs[1].dim() > 1:
        return max(produced, inputs[0].numel()) * (inputs[1].numel() // max(1, inputs[1].shape[0]))
    if name in ("embedding_bag", "_embedding_bag", "_embedding_bag_forward_only") and len(inputs) > 1 and inputs[0].dim() > 1:
        return inputs[1].numel() * inputs[0].shape[-1]
    read = sum(t.numel() for t in inputs)
    if (name in MATRIX_FUNCTIONS or name.startswith(MATRIX_FUNCTION_PREFIXES)) and inputs and inputs[0].dim() > 1:
        return max(read, produced) * inputs[0].shape[-1]
    # any other (a bilinear form, pairwise distances, a sparse product): each result sums over what the
    # largest operand holds per its leading index (a bilinear weight's d1·d2, a point's M coordinates)
    largest = max(inputs, key=lambda t: t.numel(), default=None)
    per_result = largest.numel() // max(1, largest.shape[0]) if largest is not None and largest.dim() > 1 else 1
    return max(read, produced * per_result)


def _contracted_extent(name: str, inputs: list[torch.Tensor]) -> int | None:
    """How many terms each result of a matmul-like op or a convolution sums (None: not known)."""
    operands = inputs[1:] if name.startswith(("add", "baddbmm")) else inputs
    if is_convolution(name) and "transpose" not in name and name != "conv_tbc" and len(inputs) > 1 and inputs[1].dim() > 1:
        return inputs[1].numel() // max(1, inputs[1].shape[0])
    if (
        operands
        and operands[0].dim() >= 1
        and name in ("mm", "bmm", "matmul", "mv", "dot", "vdot", "addmm", "addbmm", "baddbmm", "addmv")
    ):
        return operands[0].shape[-1]
    return None


def _custom_op_body(func: Any) -> Callable[..., Any] | None:
    """The Python function behind a ``torch.library.custom_op``/``triton_op`` (our process defined it:
    the candidate did), so its body can run where the recorder sees its ops and launches."""
    try:
        from torch._library.custom_ops import OPDEFS
    except ImportError:
        return None
    opdef = OPDEFS.get(func._schema.name)
    return getattr(opdef, "_init_fn", None)


def _watch_printing() -> None:
    """Make a tensor's printing (``str``, ``repr``, ``format``: PyTorch reads its values with dispatch
    off) tell every recorder running that data reached Python."""
    original = torch._tensor_str._str
    if getattr(original, "tells_recorders", False):
        return

    def printing(*args: Any, **kwargs: Any) -> str:
        for mode in _get_current_dispatch_mode_stack():
            if isinstance(mode, OpRecorder):
                mode.printed()
        return original(*args, **kwargs)

    printing.tells_recorders = True  # type: ignore[attr-defined]  # a mark on the function: installed once
    torch._tensor_str._str = printing


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, complex)) and not isinstance(value, bool)


def _meta_like(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


def _wrong_values(meta: torch.Tensor, device: torch.device) -> torch.Tensor:
    if meta.is_floating_point() or meta.is_complex():
        return torch.full(meta.shape, math.nan, dtype=meta.dtype, device=device)
    return torch.ones(meta.shape, dtype=meta.dtype, device=device)


def _holds_values(result: Any) -> bool:
    """Whether a launch's result carries numbers or text (not tensors, not a kernel handle)."""
    if isinstance(result, (bool, int, float, complex, str, bytes)):
        return True
    if isinstance(result, dict):
        result = list(result.values())
    return isinstance(result, (list, tuple)) and any(_holds_values(item) for item in result)


def _written_arguments(func: Any, args: Any, kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The tensors an op writes into by its schema (``out=``, in-place ``self``, a list ``_foreach_add_`` updates)."""
    written: list[torch.Tensor] = []
    for position, argument in enumerate(func._schema.arguments):
        if argument.alias_info is None or not argument.alias_info.is_write:
            continue
        value = kwargs.get(argument.name) if argument.kwarg_only or position >= len(args) else args[position]
        written.extend(tensors.tensors_in(value))
    return written


class OpRecorder(TorchDispatchMode):
    """Each aten op the forward ran, with how many calls and how many input elements it processed
    (the work PyTorch did, to tell a candidate that delegates the reference's work back to PyTorch),
    that work by family (``family_work``), the values it read into Python (``host_scalars``), and
    ``path``: the compute ops and custom launches (``LaunchCounter`` adds those) in the order they
    ran, the harness's own work inside a launch excluded (``harness_work``). Ops of another
    namespace (the candidate's own ``custom_op``/``triton_op``) are containers, not PyTorch's work:
    their bodies run under the recorder, so what PyTorch and the kernels do inside them counts as usual.

    With ``provenance_key`` it also follows what custom kernels wrote: storages a launch changed
    (``LaunchCounter`` marks them) and everything computed from them are ``written``; every other
    op's output, and the whole of a view it wrote into, is fingerprinted (``pytorch_outputs``), so
    ``pytorch_source`` can tell an output whose values PyTorch made from data no kernel touched."""

    def __init__(self, provenance_key: int | None = None, *, watch_copies: bool = False) -> None:
        super().__init__()
        _watch_printing()
        self.watch_copies = watch_copies
        self.copying_ops: set[str] = set()  # with watch_copies: compute ops whose result was, place for place, an input
        self.op_error: BaseException | None = None  # the last error an op raised (glue refusing the values it was given)
        # In the knockout: an op that refuses the poisoned values it was given returns wrong values of its
        # result's shapes instead (``_stand_in``), so the trial goes on and measures the kernels' share;
        # one that did is named in ``stood_in``
        self.stand_in_for_refusals = False
        self.stood_in: list[str] = []
        self.calls: Counter[str] = Counter()
        self.elements: Counter[str] = Counter()
        self.family_work: Counter[str] = Counter()
        self.combining = 0  # what of the pointwise work folded values together (``COMBINING``)
        self.host_scalars = 0
        self.host_bytes = 0
        self.path: list[str] = []
        # storage → what wrote it last: an op's name, or "launch:<kernel>" for every tensor a launch was given
        self.producers: dict[int, str] = {}
        self._harness_depth = 0
        self.launch_depth = 0  # inside a custom launch: its tensor plumbing is not the forward's, its compute is
        self.provenance_key = provenance_key
        self.written: set[int] = set()  # storages holding what custom kernels computed
        # Storages whose values no input's data decided (``DATA_FREE_FACTORIES`` and what PyTorch computed
        # from them alone); none once data reached Python (``escaped``), where it can come back as a factory's
        # fill value. Each leaves when its storage dies, before its address can be another's: the recorder
        # keeps no memory alive, or where the allocator puts the forward's next tensor would tell a recorded
        # call (the check call after timing) from an unrecorded one (a timed call)
        self.data_free: dict[int, weakref.finalize] = {}
        self.escaped = False
        self.pytorch_outputs: dict[tuple[int, tuple[int, ...], torch.dtype], str] = {}
        self._record_out_of_dynamo: Callable[..., Any] | None = None

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """Not torch's way of keeping Dynamo out of a mode's frames (``__torch_dispatch__`` wrapped in
        ``torch._disable_dynamo``, which loads Dynamo, most of a child's warm-up, at the first op):
        ``__torch_dispatch__`` does it itself, once something has loaded Dynamo."""
        return False

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if "torch._dynamo" not in sys.modules:  # nothing is compiled without it
            return self._record(func, args, kwargs or {})
        if self._record_out_of_dynamo is None:
            import torch._dynamo

            self._record_out_of_dynamo = torch._dynamo.disable(self._record, recursive=True)
        return self._record_out_of_dynamo(func, args, kwargs or {})

    def _record(self, func: Any, args: Any, kwargs: Any) -> Any:
        if func.namespace not in ATEN_NAMESPACES and not self._harness_depth:
            body = _custom_op_body(func)
            self.calls[f"{func.namespace}::{func.overloadpacket.__name__}"] += 1
            if body is not None:
                with self:  # its body's ops and launches are the forward's own
                    return body(*args, **kwargs)
            # one of PyTorch's own libraries (mkldnn, quantized, ...): its work, of unknown kind, counts as a contraction
            self.family_work["contraction"] += sum(t.numel() for t in tensors.tensors_in((args, kwargs)))
            result = func(*args, **kwargs)
            self.launched(f"{func.namespace}::{func.overloadpacket.__name__}", tensors.tensors_in((args, kwargs)), result)
            return result
        name = func.overloadpacket.__name__
        # an op that writes into its argument (``clamp_``, ``out=`` its own input) is a copy when it left its
        # values as they were: only a snapshot taken before it can tell
        watched = (
            [(w, w.detach().clone()) for w in _written_arguments(func, args, kwargs)]
            if self.watch_copies and not self._harness_depth and is_compute_op(name)
            else []
        )
        try:
            result = func(*args, **kwargs)
        except Exception as exc:
            if self._harness_depth:
                raise
            self.op_error = exc
            stand_in = self._stand_in(func, args, kwargs) if self.stand_in_for_refusals and not self.launch_depth else None
            if stand_in is None:
                raise
            self.stood_in.append(f"{name}: {type(exc).__name__}")
            result = stand_in[0]
        if self.launch_depth and not is_compute_op(name):
            return result  # a launch's own tensor plumbing (the interpreter copies its arguments with aten ops)
        if not self._harness_depth:
            inputs = tensors.tensors_in((args, kwargs))
            outputs = tensors.tensors_in(result)
            if self.watch_copies and is_compute_op(name):
                if any(tensors.is_copy_of(t, inputs) for t in outputs) or any(tensors.is_copy_of(w, [b]) for w, b in watched):
                    self.copying_ops.add(name)
                del watched
            self.calls[name] += 1
            self.elements[name] += sum(t.numel() for t in inputs)
            if name == "_local_scalar_dense":
                self.host_scalars += 1
                self.host_bytes += sum(t.element_size() for t in inputs)
                self.escaped = self.escaped or not self._all_data_free(inputs)
            written = _written_arguments(func, args, kwargs)
            data_free = self._track_data_free(name, inputs, outputs, written)
            if not self.launch_depth:
                for t in (*outputs, *written):
                    self.producers[tensors.storage_id(t)] = name
            if is_compute_op(name):
                self.path.append(name)
                if not data_free:
                    accumulate = bool(kwargs.get("accumulate")) or any(a is True for a in args[2:])
                    scalars = sum(1 for v in pytree.tree_leaves((args, kwargs)) if _is_number(v))
                    work = op_work(name, func._overloadname, inputs, outputs, accumulate, scalars, args)
                    self.combining += work.pop(COMBINING, 0)
                    self.family_work.update(work)
            if self.provenance_key is not None:
                with self.harness_work():
                    self._follow(name, inputs, outputs)
        return result

    def _stand_in(self, func: Any, args: Any, kwargs: dict[str, Any]) -> tuple[Any] | None:
        """What a functional op that refused its values would have returned, wrong: its result's shapes
        (from running it on meta tensors) filled with NaN, or integers and flags that are not zero. None:
        an op that writes into its arguments, or whose shapes meta tensors cannot tell."""
        if _written_arguments(func, args, kwargs):
            return None
        with self.harness_work():
            try:
                meta_args, meta_kwargs = pytree.tree_map_only(torch.Tensor, _meta_like, (args, kwargs))
                shapes = func(*meta_args, **meta_kwargs)
            except Exception:  # no meta kernel, or shapes that depend on the values: the refusal stands
                return None
            device = next((t.device for t in tensors.tensors_in((args, kwargs))), torch.device("cpu"))
            return (pytree.tree_map_only(torch.Tensor, functools.partial(_wrong_values, device=device), shapes),)

    def _all_data_free(self, inputs: list[torch.Tensor]) -> bool:
        return all(tensors.storage_id(t) in self.data_free for t in inputs)

    def _track_data_free(
        self, name: str, inputs: list[torch.Tensor], outputs: list[torch.Tensor], written: list[torch.Tensor]
    ) -> bool:
        """Whether this op's results hold values no input's data decided, noting their storages either
        way (with the arguments it wrote into, ``written``: an index written with the input's values is data).
        An op that is not data-free may have written data into any argument, whatever its schema says
        (``native_batch_norm`` updates its running statistics unmarked): each of its inputs holds data after it."""
        sources = [t for t in inputs if not any(t is w for w in written)]  # an out= buffer gives no values
        data_free = (
            not self.escaped
            and not self.launch_depth
            and (
                (name in DATA_FREE_FACTORIES and (name in SHAPE_TEMPLATE_FACTORIES or self._all_data_free(sources)))
                or (bool(inputs) and self._all_data_free(inputs))
            )
        )
        if data_free:
            for t in (*outputs, *written):
                self._mark_data_free(t)
        else:  # the written arguments are among the inputs
            for t in (*outputs, *inputs):
                self._mark_data(t)
        return data_free

    def _mark_data_free(self, t: torch.Tensor) -> None:
        storage = tensors.storage_id(t)
        if storage == -1 or storage in self.data_free:
            return
        left = weakref.finalize(t.untyped_storage(), self.data_free.pop, storage, None)
        left.atexit = False
        self.data_free[storage] = left

    def _mark_data(self, t: torch.Tensor) -> None:
        left = self.data_free.pop(tensors.storage_id(t), None)
        if left is not None:
            left.detach()

    def launched(self, label: str, arguments: list[torch.Tensor], result: Any) -> None:
        """A custom launch ran on these tensors and returned ``result``: whatever it wrote or returned
        holds data now, and a native function that returns numbers has read data into Python."""
        for t in (*arguments, *tensors.tensors_in(result)):
            self._mark_data(t)
            self.producers[tensors.storage_id(t)] = f"launch:{label}"
        self.escaped = self.escaped or _holds_values(result)

    def returned(self, output: Any) -> None:
        """Forward returned ``output``: what made each of its tensors ends the path, so a forward that
        picks which finished tensor to return (a kernel's on poisoned values, PyTorch's on clean ones)
        takes another path though it ran the same ops."""
        made = [self.producers.get(tensors.storage_id(t), "an input or a tensor made before") for t in tensors.tensors_in(output)]
        self.path.append(f"returned {', '.join(made) or 'no tensor'}")

    def printed(self) -> None:
        """A tensor's values became text (``str``, ``repr``, ``format``): data reached Python."""
        self.escaped = True

    def _follow(self, name: str, inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> None:
        if any(tensors.storage_id(t) in self.written for t in inputs):
            self.written.update(tensors.storage_id(t) for t in outputs)
            return
        # From untouched data: fresh memory, even where the allocator hands out a block a kernel wrote before
        self.written.difference_update(tensors.storage_id(t) for t in outputs)
        for t in outputs:  # every op's, not only compute ops': a result may be assembled (cat, copies into slices)
            for whole in (t, t._base) if t._base is not None else (t,):
                if whole.numel() > 1 and whole.layout == torch.strided:
                    self.pytorch_outputs[self._identity(whole)] = name

    def _identity(self, t: torch.Tensor) -> tuple[int, tuple[int, ...], torch.dtype]:
        assert self.provenance_key is not None, "provenance is followed only with a key"
        return tensors.fingerprint(t, self.provenance_key)[0], tuple(t.shape), t.dtype

    def mark_written(self, t: torch.Tensor) -> None:
        self.written.add(tensors.storage_id(t))

    def pytorch_source(self, output: Any) -> tuple[str, str] | None:
        """How PyTorch, not a custom kernel, made every output tensor, when it did: computed from
        data no custom kernel wrote (``cat`` of PyTorch pieces), or, value for value, some PyTorch
        op's own result (routed past a kernel's output with ``torch.where`` or ``+ out * 0``).
        None: a custom kernel's result reaches an output. Else (kind, how): "untouched" or "copied"."""
        outs = [t for t in tensors.tensors_in(output) if t.layout == torch.strided]
        if not outs:
            return None
        if not any(tensors.storage_id(t) in self.written for t in outs):
            return "untouched", "computed from data no custom kernel wrote"
        outs = [t for t in outs if t.numel() > 1]  # a lone number can match by chance
        with self.harness_work():
            found = [self.pytorch_outputs.get(self._identity(t)) for t in outs]
        sources = [name for name in found if name]
        if outs and len(sources) == len(outs):
            return (
                "copied",
                f"value for value what PyTorch's {', '.join(sorted(set(sources)))} computed from data no custom kernel wrote",
            )
        return None

    @contextlib.contextmanager
    def harness_work(self) -> Iterator[None]:
        self._harness_depth += 1
        try:
            yield
        finally:
            self._harness_depth -= 1

    def compute_ops(self) -> dict[str, dict[str, int]]:
        return {
            name: {"calls": n, "elements": self.elements[name]}
            for name, n in sorted(self.calls.items())
            if is_compute_op(name) and "::" not in name
        }

    def work(self) -> Work:
        """What one call did, for the judge: compute work per family and values read into Python."""
        return {
            "families": dict(self.family_work),
            "combining": self.combining,
            "host_scalars": self.host_scalars,
            "host_bytes": self.host_bytes,
        }
