"""Dynamic evidence collected in the candidate's process.

- ``LaunchCounter`` sees every Triton launch and every call into a ``load_inline`` extension.
  In *knockout* mode it poisons whatever each launch wrote: if the model's output is still right
  with the custom kernels' results destroyed, those kernels did not compute it (a decoy).
- ``OpRecorder`` lists the aten operators the forward ran, and the work they did by family, to
  compare with the reference's.
- ``IntegritySnapshot`` remembers the functions the harness relies on (timers, sync, torch
  entry points, the harness's own code and hooks) and reports any that were replaced.

All of it lives in the candidate's interpreter: it holds because the capability policy
(``reward_svc/policy.py``) keeps the candidate's Python from reaching these objects, and the
judge re-derives from output files what it can (docs/ARCHITECTURE.md, "Trust boundary").
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import threading
import time
import types
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from reward_svc.harness import tensors

# aten operators that move, view or allocate memory; everything else computes.
_NON_COMPUTE_PREFIXES = (
    "empty", "new_empty", "zeros", "ones", "full", "fill", "zero_", "view", "_unsafe_view", "reshape",
    "as_strided", "expand", "permute", "transpose", "t", "contiguous", "clone", "copy", "_to_copy", "to",
    "detach", "alias", "slice", "select", "squeeze", "unsqueeze", "flatten", "unflatten", "split", "chunk",
    "narrow", "size", "stride", "sym_", "lift", "_local_scalar_dense", "item", "resize", "set_", "unbind",
    "is_", "arange", "_reshape_alias", "new_zeros", "new_ones", "new_full", "lift_fresh", "dim", "numel",
    "record_stream", "_has_compatible_shallow_copy_type", "_unsafe_index", "stack", "cat",
)
ATEN_NAMESPACES = frozenset({"aten", "prims"})
# Compute ops by the kind of work they do. PyTorch rewrites one op as others (relu as clamp_min, a
# softmax as exp/sum/div, einsum as bmm, a matmul as a broadcast multiply and a sum), but rarely
# across these kinds, so the accounting compares work per family, not per name.
CONTRACTION_OPS = frozenset({
    "mm", "bmm", "addmm", "addbmm", "baddbmm", "matmul", "mv", "addmv", "dot", "vdot", "addr", "outer", "ger", "linear",
    "einsum", "tensordot", "bilinear", "_trilinear", "kron", "convolution", "_convolution", "conv1d", "conv2d", "conv3d",
    "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "cudnn_convolution", "cudnn_convolution_transpose",
    "mkldnn_convolution", "_convolution_mode", "conv_tbc", "slow_conv3d_forward", "_slow_conv2d_forward",
    "slow_conv_transpose2d", "slow_conv_transpose3d", "_scaled_mm", "_int_mm", "cdist", "_cdist_forward",
    "scaled_dot_product_attention", "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu", "_efficient_attention_forward",
    "_flash_attention_forward", "_scaled_dot_product_attention_math", "embedding_bag", "_embedding_bag",
    "_embedding_bag_forward_only",
})
REDUCTION_OPS = frozenset({
    "sum", "mean", "prod", "amax", "amin", "max", "min", "argmax", "argmin", "aminmax", "var", "std", "var_mean",
    "std_mean", "norm", "linalg_vector_norm", "linalg_matrix_norm", "frobenius_norm", "nuclear_norm", "logsumexp",
    "_softmax", "softmax", "_log_softmax", "log_softmax", "_safe_softmax", "all", "any", "count_nonzero", "nansum", "nanmean", "native_layer_norm", "native_group_norm",
    "native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training", "batch_norm",
    "_batch_norm_impl_index", "cudnn_batch_norm", "layer_norm", "group_norm", "instance_norm", "rms_norm",
    "_fused_rms_norm", "max_pool1d", "max_pool2d", "max_pool3d", "max_pool1d_with_indices", "max_pool2d_with_indices",
    "max_pool3d_with_indices", "avg_pool1d", "avg_pool2d", "avg_pool3d", "adaptive_avg_pool1d", "adaptive_avg_pool2d",
    "adaptive_avg_pool3d", "_adaptive_avg_pool2d", "_adaptive_avg_pool3d", "adaptive_max_pool1d", "adaptive_max_pool2d",
    "adaptive_max_pool3d", "fractional_max_pool2d", "fractional_max_pool3d", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "nll_loss_forward", "nll_loss2d_forward",
    "nll_loss", "nll_loss_nd", "cross_entropy_loss", "kl_div", "binary_cross_entropy", "binary_cross_entropy_with_logits",
    "soft_margin_loss", "multilabel_margin_loss_forward", "multi_margin_loss", "dist",
    "renorm", "histc", "bincount", "_weight_norm_interface", "cosine_similarity", "_pdist_forward", "trace",
})
DATA_OPS = frozenset({
    "gather", "scatter", "scatter_add", "scatter_reduce", "index_select", "index", "index_put", "index_add", "index_copy",
    "take", "take_along_dim", "masked_select", "masked_scatter", "embedding", "nonzero", "flip", "roll", "repeat", "tile",
    "repeat_interleave", "im2col", "col2im", "unfold", "constant_pad_nd", "reflection_pad1d", "reflection_pad2d",
    "reflection_pad3d", "replication_pad1d", "replication_pad2d", "replication_pad3d", "upsample_nearest1d",
    "upsample_nearest2d", "upsample_nearest3d", "upsample_bilinear2d", "upsample_linear1d", "upsample_trilinear3d",
    "upsample_bicubic2d", "grid_sampler_2d", "grid_sampler_3d", "unique", "_unique2",
    "unique_dim", "diag", "tril", "triu", "pixel_shuffle", "pixel_unshuffle", "channel_shuffle",
})
ELEMENTWISE_OVERLOADS = frozenset({"other", "binary_out"})  # max(a, b) and min(a, b): pointwise, not reductions
# Reductions that keep their input's size (a sort, a scan, a search among boundaries): reductions
# whatever the sizes, never pointwise work in disguise.
SCAN_OPS = frozenset({"sort", "argsort", "msort", "topk", "kthvalue", "median", "nanmedian", "mode", "cumsum", "cumprod",
                      "cummax", "cummin", "logcumsumexp", "_cummax_helper", "_cummin_helper", "searchsorted", "bucketize"})
# Matrix functions (a matrix exponential is matmuls; a solve, an inverse, a factorisation, an FFT):
# contractions, whatever their names.
MATRIX_FUNCTIONS = frozenset({"matrix_exp", "matrix_power", "cholesky", "cholesky_solve", "cholesky_inverse", "inverse", "det",
                              "logdet", "slogdet", "svd", "qr", "geqrf", "orgqr", "ormqr", "lu_unpack", "lu_solve",
                              "triangular_solve", "pinverse", "chain_matmul", "lstsq", "symeig", "eig"})
MATRIX_FUNCTION_PREFIXES = ("linalg_", "_linalg_", "fft_", "_fft_")


def is_compute_op(name: str) -> bool:
    return not any(name == p or name.startswith(p + ".") or name.startswith(p + "_") or name == p.rstrip("_")
                   for p in _NON_COMPUTE_PREFIXES)


# Ops that are several passes of work in one: their work per element read, split by family, so a
# PyTorch decomposition of one (a softmax as amax, sub, exp, sum, div) weighs what the op does, and
# PyTorch doing one pass of it (the row maxima before a kernel) weighs that pass only.
COMPOSITE_WORK = {
    **dict.fromkeys(("softmax", "_softmax", "_safe_softmax", "log_softmax", "_log_softmax", "logsumexp"),
                    {"reduction": 2, "pointwise": 3}),
    **dict.fromkeys(("native_layer_norm", "layer_norm", "native_group_norm", "group_norm", "instance_norm", "native_batch_norm",
                     "_native_batch_norm_legit", "batch_norm", "_batch_norm_impl_index", "cudnn_batch_norm"),
                    {"reduction": 2, "pointwise": 4}),
    "_native_batch_norm_legit_no_training": {"pointwise": 4},  # running statistics: no reduction
    **dict.fromkeys(("rms_norm", "_fused_rms_norm"), {"reduction": 1, "pointwise": 3}),
    **dict.fromkeys(("var", "std", "var_mean", "std_mean"), {"reduction": 2, "pointwise": 1}),
    **dict.fromkeys(("norm", "linalg_vector_norm", "frobenius_norm", "dist", "renorm"), {"reduction": 1, "pointwise": 1}),
    **dict.fromkeys(("mse_loss", "l1_loss"), {"reduction": 1, "pointwise": 2}),
    **dict.fromkeys(("smooth_l1_loss", "huber_loss", "kl_div", "soft_margin_loss", "multi_margin_loss"), {"reduction": 1, "pointwise": 3}),
    **dict.fromkeys(("binary_cross_entropy", "binary_cross_entropy_with_logits"), {"reduction": 1, "pointwise": 4}),
    **dict.fromkeys(("cosine_similarity", "cross_entropy_loss"), {"reduction": 3, "pointwise": 3}),
}
POINTWISE_WEIGHT = {  # operations per result element of activations that are one op in aten and several spelled out
    "gelu": 4, "mish": 4, "softplus": 3, "log_sigmoid_forward": 3, "hardswish": 3, "silu": 2, "elu": 2, "selu": 2, "celu": 2,
    "sigmoid": 2, "tanh": 2, "erf": 2, "hardsigmoid": 2, "softshrink": 2, "hardshrink": 2, "addcdiv": 2, "lerp": 2,
}
SMALL_EXTENT = 4  # a contraction over at most this many terms, or a reduction of at most this many values into one, is pointwise work


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
        if (produced and max((t.numel() for t in inputs), default=0) <= SMALL_EXTENT * produced
                and base not in COMPOSITE_WORK and base not in SCAN_OPS):
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
CONVOLUTIONS = frozenset({"convolution", "_convolution", "conv1d", "conv2d", "conv3d", "cudnn_convolution", "mkldnn_convolution",
                          "_convolution_mode", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "cudnn_convolution_transpose",
                          "slow_conv3d_forward", "_slow_conv2d_forward", "slow_conv_transpose2d", "slow_conv_transpose3d"})


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
    if name in ("convolution", "_convolution", "conv1d", "conv2d", "conv3d", "cudnn_convolution", "mkldnn_convolution",
                "_convolution_mode") and len(inputs) > 1 and inputs[1].dim() > 1:
        return inputs[1].numel() // max(1, inputs[1].shape[0])
    if operands and operands[0].dim() >= 1 and name in ("mm", "bmm", "matmul", "mv", "dot", "vdot", "addmm", "addbmm", "baddbmm", "addmv"):
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

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
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
            if self.watch_copies and is_compute_op(name) and any(_copied(t, inputs) for t in tensors.tensors_in(result)):
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
        if any(_storage(t) in self.written for t in inputs):
            self.written.update(_storage(t) for t in outputs)
            return
        # From untouched data: fresh memory, even where the allocator hands out a block a kernel wrote before
        self.written.difference_update(_storage(t) for t in outputs)
        for t in outputs:  # every op's, not only compute ops': a result may be assembled (cat, copies into slices)
            for whole in (t, t._base) if t._base is not None else (t,):
                if whole.numel() > 1 and whole.layout == torch.strided:
                    self.pytorch_outputs[self._identity(whole)] = name

    def _identity(self, t: torch.Tensor) -> tuple[int, tuple[int, ...], torch.dtype]:
        return tensors.fingerprint(t, self.provenance_key)[0], tuple(t.shape), t.dtype

    def mark_written(self, t: torch.Tensor) -> None:
        self.written.add(_storage(t))

    def pytorch_source(self, output: Any) -> tuple[str, str] | None:
        """How PyTorch, not a custom kernel, made every output tensor, when it did: computed from
        data no custom kernel wrote (``cat`` of PyTorch pieces), or, value for value, some PyTorch
        op's own result (routed past a kernel's output with ``torch.where`` or ``+ out * 0``).
        None: a custom kernel's result reaches an output. Else (kind, how): "untouched" or "copied"."""
        outs = [t for t in tensors.tensors_in(output) if t.layout == torch.strided]
        if not outs:
            return None
        if not any(_storage(t) in self.written for t in outs):
            return "untouched", "computed from data no custom kernel wrote"
        outs = [t for t in outs if t.numel() > 1]  # a lone number can match by chance
        with self.harness_work():
            sources = [self.pytorch_outputs.get(self._identity(t)) for t in outs]
        if outs and all(sources):
            return "copied", f"value for value what PyTorch's {', '.join(sorted(set(sources)))} computed from data no custom kernel wrote"
        return None

    @contextlib.contextmanager
    def harness_work(self) -> Iterator[None]:
        self._harness_depth += 1
        try:
            yield
        finally:
            self._harness_depth -= 1

    def compute_ops(self) -> dict[str, dict[str, int]]:
        return {name: {"calls": n, "elements": self.elements[name]} for name, n in sorted(self.calls.items())
                if is_compute_op(name) and "::" not in name}

    def work(self) -> dict[str, Any]:
        """What one call did, for the judge: compute work per family and values read into Python."""
        return {"families": dict(self.family_work), "host_scalars": self.host_scalars, "host_bytes": self.host_bytes}


class LaunchCounter:
    def __init__(self) -> None:
        self.launches: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()
        self.knockout = False
        self.poisoned = 0
        self.copies = 0  # writes the knockout left alone: copies of a launch's inputs
        # The reference has an op that acts as a copy on the knockout's values (a clamp whose bounds do
        # not bind there): an honest kernel of it looks like a copy, so copies are poisoned like the rest.
        self.copies_are_work = False
        self.recorder: OpRecorder | None = None  # while set, launches join its path
        self.forged: list[str] = []  # launches refused for an argument posing as a tensor
        self.refused_sources: list[str] = []  # load_inline calls harness/native_policy.py refused

    @property
    def total(self) -> int:
        return sum(self.launches.values())

    def around(self, label: str, call: Callable[[], Any], args: Any, kwargs: Any) -> Any:
        """Count one launch; in knockout mode, poison every tensor it wrote and returned (but copies of
        its inputs: a copy computes nothing). Inside it, the recorder leaves out tensor plumbing (the
        Triton interpreter copies each argument with aten ops) and counts compute ops: a launch hook,
        a ``load_inline`` function's ATen calls are the forward's own work."""
        self.launches[label] += 1
        recorder = self.recorder
        if recorder is not None:
            inner = call

            def call() -> Any:
                recorder.launch_depth += 1
                try:
                    return inner()
                finally:
                    recorder.launch_depth -= 1

        if recorder is not None:
            recorder.path.append(f"launch:{label}")
            if recorder.provenance_key is not None:
                return self._follow_writes(recorder, label, call, launch_tensors(args, kwargs))
        if not self.knockout:
            return self._call(label, call)
        return self._knock_out(label, call, launch_tensors(args, kwargs),
                               recorder.harness_work if recorder is not None else contextlib.nullcontext)

    def _knock_out(self, label: str, call: Callable[[], Any], inputs: list[torch.Tensor],
                   harness_work: Callable[[], contextlib.AbstractContextManager[Any]]) -> Any:
        """The launch, then poison on what it wrote. A tensor it left bit for bit as it was was
        either only read or written with the values it held already (an output buffer kept across
        calls, after the refresh trial computed the same answer): poisoned and launched onto once
        more, the ones it writes are outputs too, and the others get their values back."""
        with harness_work():
            before = [t.clone() for t in inputs]
        result = self._call(label, call)
        with harness_work():
            _synchronize()
            changed = [t for t, old in zip(inputs, before) if not tensors.same_bits(t, old)]
            written = [t for t in changed if self.copies_are_work or not _copied(t, before)]
            self.copies += len(changed) - len(written)
            kept = [(t, old) for t, old in zip(inputs, before) if tensors.same_bits(t, old)]
            if kept:
                # the second launch may write into the tensors the first one changed (a copy's destination,
                # from its poisoned source): they get back what the first launch left in them
                first = [(t, t.clone()) for t in changed]
                for t, _ in kept:
                    tensors.poison_(t)
                poisoned = [t.clone() for t, _ in kept]
                call()
                _synchronize()
                for t, after in first:
                    t.copy_(after)
                for (t, old), poison in zip(kept, poisoned):
                    if tensors.same_bits(t, poison):
                        t.copy_(old)  # only read: as it was
                    else:
                        written.append(t)
            returned = tensors.tensors_in(result)
            computed = [t for t in returned if self.copies_are_work or not _copied(t, before)]
            self.copies += len(returned) - len(computed)
            for t in written + computed:
                tensors.poison_(t)
                self.poisoned += 1
        return result

    def _follow_writes(self, recorder: OpRecorder, label: str, call: Callable[[], Any], inputs: list[torch.Tensor]) -> Any:
        """A launch under provenance tracking: the tensors it changed, and those it returned, hold
        what a custom kernel computed."""
        key = recorder.provenance_key
        with recorder.harness_work():
            before = [tensors.fingerprint(t, key) for t in inputs]
        result = self._call(label, call)
        with recorder.harness_work():
            _synchronize()
            for t, old in zip(inputs, before):
                if tensors.fingerprint(t, key) != old:
                    recorder.mark_written(t)
            for t in tensors.tensors_in(result):
                recorder.mark_written(t)
        return result

    def _call(self, label: str, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except BaseException:
            self.failures[label] += 1
            raise

    def install_triton(self) -> None:
        """Wrap the launch entry point of compiled and interpreted Triton kernels."""
        try:
            from triton.runtime.jit import JITFunction
        except ImportError:
            return
        classes: list[type] = [JITFunction]
        try:
            from triton.runtime.interpreter import InterpretedFunction
            classes.append(InterpretedFunction)
        except ImportError:
            pass
        for cls in classes:
            cls.run = self._counted_run(cls.run)

    def _counted_run(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``JITFunction.run`` counted (the original in a closure, not a parameter a caller could pass)."""

        def run(fn_self, *args, **kwargs):  # type: ignore[no-untyped-def]
            if kwargs.get("warmup"):
                return original(fn_self, *args, **kwargs)
            label = f"triton:{getattr(getattr(fn_self, 'fn', None), '__name__', 'kernel')}"
            forged = forged_pointers(args, kwargs)
            if forged:
                self.forged.append(f"{label}: {forged}")
                raise TypeError(f"{label} launched with {forged}: a Triton launch takes tensors")
            return self.around(label, lambda: original(fn_self, *args, **kwargs), args, kwargs)

        return run

    def wrap_extension(self, module: types.ModuleType, name: str) -> types.ModuleType:
        """A stand-in for a load_inline module whose every function call is counted."""
        counted = types.ModuleType(getattr(module, "__name__", name))
        for attr in dir(module):
            value = getattr(module, attr)
            if callable(value) and not attr.startswith("__") and not isinstance(value, type):
                value = self._counted(f"cuda:{name}.{attr}", value)
            setattr(counted, attr, value)
        return counted

    def _counted(self, label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            return self.around(label, lambda: fn(*args, **kwargs), args, kwargs)

        return call


def launch_tensors(args: Any, kwargs: Any) -> list[torch.Tensor]:
    """The tensors a launch can read or write: its tensor arguments, and the tensors Triton's
    wrappers carry (``TensorDescriptor``, ``triton.reinterpret``: a ``base`` attribute)."""
    found = tensors.tensors_in((args, kwargs))
    for value in [*(args if isinstance(args, (list, tuple)) else ()), *(kwargs or {}).values()]:
        base = getattr(value, "base", None) if not isinstance(value, torch.Tensor) else None
        if isinstance(base, torch.Tensor):
            found.append(base)
    return found


COPY_SHARE = 0.99  # a launch's result this much bit for bit one of its inputs, place for place, is a copy


def _copied(t: torch.Tensor, sources: list[torch.Tensor]) -> bool:
    """Whether ``t`` holds (nearly all of) another launch argument's values in the same places: a copy
    kernel computes nothing, so the knockout leaves what it wrote alone and the kernels' share of the
    output shows it."""
    return any(source.numel() == t.numel() and source.dtype == t.dtype and source.data_ptr() != t.data_ptr() and t.numel()
               and tensors.same_share(t, source) >= COPY_SHARE for source in sources)


def forged_pointers(args: Any, kwargs: Any) -> str | None:
    """An argument that offers ``data_ptr()`` (Triton reads any such object as a pointer) but is
    neither a tensor nor one of Triton's own wrappers around a tensor: a pointer to anywhere."""
    for value in [*(args if isinstance(args, (list, tuple)) else ()), *(kwargs or {}).values()]:
        if isinstance(value, torch.Tensor) or not hasattr(type(value), "data_ptr"):
            continue
        base = getattr(value, "base", None)
        if not (type(value).__module__.startswith("triton.") and isinstance(base, torch.Tensor)):
            return f"a {type(value).__name__} posing as a tensor"
    return None


def _synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _storage(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # no storage of its own (sparse, nested): never matches
        return -1


def _watched_functions() -> dict[str, Any]:
    import builtins

    import torch.utils.cpp_extension as cpp_extension

    watched = {
        "time.perf_counter": time.perf_counter, "time.perf_counter_ns": time.perf_counter_ns,
        "time.time": time.time, "time.monotonic": time.monotonic,
        "threading.Thread.start": threading.Thread.start,
        "torch.allclose": torch.allclose, "torch.equal": torch.equal, "torch.isclose": torch.isclose,
        "torch.save": torch.save, "torch.load": torch.load, "torch.manual_seed": torch.manual_seed,
        "torch.Tensor.clone": torch.Tensor.clone, "torch.Tensor.to": torch.Tensor.to,
        "torch.Tensor.copy_": torch.Tensor.copy_, "torch.Tensor.__eq__": torch.Tensor.__eq__,
        "torch.nn.Module.__call__": torch.nn.Module.__call__,
        "torch.utils._python_dispatch.TorchDispatchMode.__enter__": TorchDispatchMode.__enter__,
        "builtins.open": builtins.open, "builtins.print": builtins.print, "builtins.isinstance": builtins.isinstance,
        "builtins.len": builtins.len, "builtins.sum": builtins.sum,
        "torch.cuda.synchronize": torch.cuda.synchronize, "torch.cuda.Event": torch.cuda.Event,
        "torch.cuda.Event.record": torch.cuda.Event.record,
        "torch.cuda.Event.elapsed_time": torch.cuda.Event.elapsed_time,
        "torch.cuda.Event.synchronize": torch.cuda.Event.synchronize,
        "torch.cuda.current_stream": torch.cuda.current_stream,
        "torch.utils.cpp_extension.load_inline": cpp_extension.load_inline,
        "json.dumps": json.dumps, "json.loads": json.loads, "json.JSONEncoder.encode": json.JSONEncoder.encode,
        "os.replace": os.replace, "os.write": os.write, "os._exit": os._exit,
    }
    try:
        from triton.runtime.jit import JITFunction

        watched["triton.JITFunction.run"] = JITFunction.run
        from triton.runtime.interpreter import InterpretedFunction

        watched["triton.InterpretedFunction.run"] = InterpretedFunction.run
    except ImportError:
        pass
    watched.update(_harness_code())
    return watched


def _harness_code() -> dict[str, Any]:
    """The harness's own modules, their functions and classes, and those classes' methods: what the
    candidate's process runs to collect and report the evidence."""
    found: dict[str, Any] = {}
    for name, module in list(sys.modules.items()):
        if not name.startswith("reward_svc.") or not isinstance(module, types.ModuleType):
            continue
        found[f"sys.modules[{name}]"] = module
        for attr, value in list(vars(module).items()):
            if isinstance(value, (types.FunctionType, type)) and getattr(value, "__module__", None) == name:
                found[f"{name}.{attr}"] = value
                if isinstance(value, types.FunctionType):
                    found[f"{name}.{attr}.__code__"] = value.__code__
                else:
                    for method, function in list(vars(value).items()):
                        if isinstance(function, types.FunctionType):
                            found[f"{name}.{attr}.{method}"] = function
                            found[f"{name}.{attr}.{method}.__code__"] = function.__code__
    return found


class IntegritySnapshot:
    """Identity of every function the harness trusts (its own code, the hooks it installed, the torch
    and timer functions it calls), taken once the hooks are in and before the candidate is imported."""

    def __init__(self) -> None:
        self.expected = _watched_functions()
        self.flags = precision_flags()

    def replaced(self) -> list[str]:
        now = _watched_functions()
        return [name for name, fn in self.expected.items() if now.get(name) is not fn]

    def precision_changes(self) -> list[str]:
        now = precision_flags()
        return [f"{k}: {self.flags[k]} -> {now[k]}" for k in self.flags if now[k] != self.flags[k]]


# Events no kernel's Python raises once its module is imported: reaching frames or the heap, other
# processes, the network, foreign libraries, or files outside the child's own directories. Each one
# refused is written to the audit log at once (the worker reads it: collected outside the objects the
# candidate's code can reach), and raised where it happened.
AUDIT_REFUSED_PREFIXES = ("socket.", "winreg.", "msvcrt.")
AUDIT_REFUSED = frozenset({
    "sys.settrace", "sys.setprofile", "sys._current_frames", "sys._current_exceptions", "gc.get_objects",
    "gc.get_referrers", "gc.get_referents", "os.system", "os.exec", "os.spawn", "os.fork", "os.forkpty",
    "os.kill", "os.killpg", "pty.spawn", "sys.addaudithook", "cpython.PyInterpreterState_Clear", "os.chmod", "os.chown",
})
FILE_EVENTS = frozenset({"open", "os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.symlink", "os.link", "os.truncate",
                         "shutil.rmtree", "shutil.move", "shutil.copyfile", "os.utime"})
TWO_PATH_EVENTS = frozenset({"os.rename", "os.link", "shutil.move", "shutil.copyfile"})
# Programs a kernel's build runs (nvcc's phases, the host compiler and linker, Triton's bundled ptxas and
# its launcher stubs' compiler, ldconfig for libcuda), by name or name prefix (``ptxas-blackwell``, ``gcc-12``).
TOOLCHAIN = frozenset({"nvcc", "gcc", "g++", "cc", "c++", "ld", "ld.gold", "ld.bfd", "ninja", "cudafe++", "cicc", "fatbinary",
                       "nvlink", "nvdisasm", "cuobjdump", "ldconfig", "ldconfig.real", "which", "uname", "as", "ar", "clang", "clang++"})
TOOLCHAIN_PREFIXES = ("ptxas", "gcc-", "g++-", "clang-", "x86_64-linux-gnu-")


SHELLS = frozenset({"bash", "sh", "dash"})
BUILD_CODE = ("reward_svc/nvcc_phases.py", "reward_svc/compile.py")  # run nvcc's plan through a shell


def _spawned_by_the_build() -> bool:
    """Whether a process is being started by the harness's own compile path (nvcc's phases run as
    shell steps there), not by anything else in the child."""
    frame = sys._getframe(2)
    for _ in range(40):
        if frame is None:
            return False
        if frame.f_code.co_filename.endswith(BUILD_CODE):
            return True
        frame = frame.f_back
    return False


def install_audit_hook(log_path: str, writable: list[str]) -> Callable[[], None]:
    """An audit hook (it cannot be removed) that refuses ``AUDIT_REFUSED`` events, processes other than
    the toolchain's, and writes (or removals) outside ``writable``; returns the switch that arms it,
    pulled once the harness is set up, just before the candidate is imported."""
    import os

    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    roots = tuple(os.path.realpath(p) + os.sep for p in (*writable, "/dev", "/proc/self"))  # /dev/null for a subprocess's output
    log_real = os.path.realpath(log_path)
    armed = [False]

    def refuse(event: str, detail: str) -> None:
        os.write(fd, f"{event}: {detail}"[:500].replace("\n", " ").encode(errors="replace") + b"\n")
        raise PermissionError(f"kz-audit: {event} is not a kernel's to do")

    def writes(event: str, args: tuple[Any, ...]) -> bool:
        if event != "open":
            return True
        mode, flags = (args[1] if len(args) > 1 else None), (args[2] if len(args) > 2 else 0)
        return bool((isinstance(mode, str) and any(c in mode for c in "wax+")) or (isinstance(flags, int) and flags & 0o3))

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if not armed[0]:
            return
        if event in AUDIT_REFUSED or event.startswith(AUDIT_REFUSED_PREFIXES):
            refuse(event, repr(args)[:200])
        elif event in ("subprocess.Popen", "os.posix_spawn"):
            executable = os.path.basename(os.fsdecode(args[0] if args[0] else (args[1] or [""])[0]))
            allowed = executable in TOOLCHAIN or executable.startswith(TOOLCHAIN_PREFIXES) or (
                executable in SHELLS and _spawned_by_the_build())
            if not allowed:
                refuse(event, executable)
        elif event in FILE_EVENTS and args and writes(event, args):
            # a rename, link or move writes where it goes as well as where it comes from (a symlink: where it is made)
            for target in (args[1:2] if event == "os.symlink" else args[:2] if event in TWO_PATH_EVENTS else args[:1]):
                if not isinstance(target, (str, bytes, os.PathLike)):
                    continue
                path = os.path.realpath(os.fsdecode(target))
                if path == log_real or not (path + os.sep).startswith(roots):
                    refuse(event, path)

    sys.addaudithook(hook)

    def arm() -> None:
        armed[0] = True

    return arm


def precision_flags() -> dict[str, Any]:
    return {
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
        "cuda.matmul.allow_fp16_reduced_precision_reduction": torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
        "cuda.matmul.allow_bf16_reduced_precision_reduction": torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
        "default_dtype": str(torch.get_default_dtype()),
    }
