"""What PyTorch did in a child: every aten op a forward ran, the work it did by family, and where
custom kernels' results went (``OpRecorder``).

The reward harness compares a candidate's PyTorch work with the reference's (PyTorch doing the
reference's work back is no kernel), follows what custom kernels wrote (provenance) and notes the
reference's ops that act as copies on its values; the Proposer's validation hashes the op graph.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, TypedDict

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from services.children import tensors


class Work(TypedDict):
    """What PyTorch did in one call (``OpRecorder.work``): compute work by family, values read into Python."""

    families: dict[str, int]
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
        "bincount",
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
        "scatter_add",
        "scatter_reduce",
        "index_select",
        "index",
        "index_put",
        "index_add",
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
        "col2im",
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
        "unique",
        "_unique2",
        "unique_dim",
        "diag",
        "tril",
        "triu",
        "pixel_shuffle",
        "pixel_unshuffle",
        "channel_shuffle",
    }
)
ELEMENTWISE_OVERLOADS = frozenset({"other", "binary_out"})  # max(a, b) and min(a, b): pointwise, not reductions
# Reductions that keep their input's size (a sort, a scan, a search among boundaries): reductions
# whatever the sizes, never pointwise work in disguise.
SCAN_OPS = frozenset(
    {
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
    **dict.fromkeys(("norm", "linalg_vector_norm", "frobenius_norm", "dist", "renorm"), {"reduction": 1, "pointwise": 1}),
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


def op_family(name: str) -> str:
    """The family of an aten compute op (in-place ``scatter_`` is ``scatter``'s): contraction,
    reduction, data or pointwise."""
    base = name[:-1] if name.endswith("_") and not name.endswith("__") else name
    if base in REDUCTION_OPS or base in SCAN_OPS:
        return "reduction"
    if base in CONTRACTION_OPS or base in MATRIX_FUNCTIONS or base.startswith(MATRIX_FUNCTION_PREFIXES):
        return "contraction"
    return "data" if base in DATA_OPS else "pointwise"


def op_work(name: str, overload: str, inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> dict[str, int]:
    """The work one aten compute op did, by family. Contractions, reductions and data ops: the
    elements they read (a composite op: split by family, ``COMPOSITE_WORK``). A pointwise op: its
    result's elements times the operations that make each (one per tensor operand past the first,
    at least one; an activation's own weight), so ``addcmul`` weighs what ``mul`` and ``add`` do. A
    contraction over at most ``SMALL_EXTENT`` terms (a matmul with an inner size of 1) and a reduction
    of at most that many values into each result are pointwise work in disguise; a pointwise op that
    broadcasts its inputs into a larger result (an outer product spelled ``a[:, :, None] * b``) is a
    contraction of that result's size."""
    base = name[:-1] if name.endswith("_") and not name.endswith("__") else name
    family = op_family(name)
    read = sum(t.numel() for t in inputs)
    produced = max((t.numel() for t in outputs), default=0)
    if family == "reduction" and overload in ELEMENTWISE_OVERLOADS:
        family = "pointwise"
    if family == "contraction":
        extent = _contracted_extent(base, inputs)
        if extent is not None and extent <= SMALL_EXTENT:  # its products, and the added term of addmm and kin
            return {"pointwise": produced * (extent + base.startswith(("add", "baddbmm")))}
        return {"contraction": _multiply_adds(base, inputs, produced)}
    if family == "reduction":
        if (
            produced
            and max((t.numel() for t in inputs), default=0) <= SMALL_EXTENT * produced
            and base not in COMPOSITE_WORK
            and base not in SCAN_OPS
        ):
            return {"pointwise": read}
        return {family: read * factor for family, factor in COMPOSITE_WORK.get(base, {"reduction": 1}).items()}
    if family == "data":
        return {"data": read}
    if inputs and produced > max(t.numel() for t in inputs):
        return {"contraction": produced}
    operands = sum(1 for t in inputs if t.numel() > 1)
    return {"pointwise": produced * max(1, operands - 1, POINTWISE_WEIGHT.get(base, 1))}


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
    a matmul of its operand by itself; other contractions by the larger of what they read and write."""
    operands = inputs[1:] if name.startswith(("add", "baddbmm")) else inputs
    if name == "linear" and len(inputs) > 1:
        return inputs[0].numel() * inputs[1].shape[0]
    if name in MATMULS and len(operands) > 1:
        return operands[0].numel() * (operands[1].shape[-1] if operands[1].dim() > 1 else 1)
    if name in VECTOR_PRODUCTS and operands:
        return operands[0].numel()
    if name in CONVOLUTIONS and len(inputs) > 1 and inputs[1].dim() > 1:
        return max(produced, inputs[0].numel()) * (inputs[1].numel() // max(1, inputs[1].shape[0]))
    if name in ("embedding_bag", "_embedding_bag", "_embedding_bag_forward_only") and len(inputs) > 1 and inputs[0].dim() > 1:
        return inputs[1].numel() * inputs[0].shape[-1]
    read = sum(t.numel() for t in inputs)
    if (name in MATRIX_FUNCTIONS or name.startswith(MATRIX_FUNCTION_PREFIXES)) and inputs and inputs[0].dim() > 1:
        return max(read, produced) * inputs[0].shape[-1]
    return max(read, produced)


def _contracted_extent(name: str, inputs: list[torch.Tensor]) -> int | None:
    """How many terms each result of a matmul-like op or a convolution sums (None: not known)."""
    operands = inputs[1:] if name.startswith(("add", "baddbmm")) else inputs
    if (
        name
        in (
            "convolution",
            "_convolution",
            "conv1d",
            "conv2d",
            "conv3d",
            "cudnn_convolution",
            "mkldnn_convolution",
            "_convolution_mode",
        )
        and len(inputs) > 1
        and inputs[1].dim() > 1
    ):
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
        self.watch_copies = watch_copies
        self.copying_ops: set[str] = set()  # with watch_copies: compute ops whose result was, place for place, an input
        self.op_error: BaseException | None = None  # the last error an op raised (glue refusing the values it was given)
        self.calls: Counter[str] = Counter()
        self.elements: Counter[str] = Counter()
        self.family_work: Counter[str] = Counter()
        self.host_scalars = 0
        self.host_bytes = 0
        self.path: list[str] = []
        self._harness_depth = 0
        self.launch_depth = 0  # inside a custom launch: its tensor plumbing is not the forward's, its compute is
        self.provenance_key = provenance_key
        self.written: set[int] = set()  # storages holding what custom kernels computed
        self.pytorch_outputs: dict[tuple[int, tuple[int, ...], torch.dtype], str] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func.namespace not in ATEN_NAMESPACES and not self._harness_depth:
            body = _custom_op_body(func)
            self.calls[f"{func.namespace}::{func.overloadpacket.__name__}"] += 1
            if body is not None:
                with self:  # its body's ops and launches are the forward's own
                    return body(*args, **kwargs)
            # one of PyTorch's own libraries (mkldnn, quantized, ...): its work, of unknown kind, counts as a contraction
            self.family_work["contraction"] += sum(t.numel() for t in tensors.tensors_in((args, kwargs)))
            return func(*args, **kwargs)
        name = func.overloadpacket.__name__
        try:
            result = func(*args, **kwargs)
        except Exception as exc:
            if not self._harness_depth:
                self.op_error = exc
            raise
        if self.launch_depth and not is_compute_op(name):
            return result  # a launch's own tensor plumbing (the interpreter copies its arguments with aten ops)
        if not self._harness_depth:
            inputs = tensors.tensors_in((args, kwargs))
            if (
                self.watch_copies
                and is_compute_op(name)
                and any(tensors.is_copy_of(t, inputs) for t in tensors.tensors_in(result))
            ):
                self.copying_ops.add(name)
            self.calls[name] += 1
            self.elements[name] += sum(t.numel() for t in inputs)
            if name == "_local_scalar_dense":
                self.host_scalars += 1
                self.host_bytes += sum(t.element_size() for t in inputs)
            if is_compute_op(name):
                self.path.append(name)
                self.family_work.update(op_work(name, func._overloadname, inputs, tensors.tensors_in(result)))
            if self.provenance_key is not None:
                with self.harness_work():
                    self._follow(name, inputs, tensors.tensors_in(result))
        return result

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
        return {"families": dict(self.family_work), "host_scalars": self.host_scalars, "host_bytes": self.host_bytes}
