"""Dynamic evidence collected in the candidate's process.

- ``LaunchCounter`` sees every Triton launch and every call into a ``load_inline`` extension.
  In *knockout* mode it poisons whatever each launch wrote: if the model's output is still right
  with the custom kernels' results destroyed, those kernels did not compute it (a decoy).
- ``OpRecorder`` lists the aten operators the forward ran, to compare with the reference's.
- ``IntegritySnapshot`` remembers the functions the harness relies on (timers, sync, torch
  entry points) and reports any that were replaced.
"""

from __future__ import annotations

import contextlib
import functools
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


def is_compute_op(name: str) -> bool:
    return not any(name == p or name.startswith(p + ".") or name.startswith(p + "_") or name == p.rstrip("_")
                   for p in _NON_COMPUTE_PREFIXES)


class OpRecorder(TorchDispatchMode):
    """Each aten op the forward ran, with how many calls and how many input elements it processed
    (the work PyTorch did, to tell a candidate that delegates the reference's work back to PyTorch),
    and ``path``: the compute ops and custom launches (``LaunchCounter`` adds those) in the order
    they ran, the harness's own work inside a launch excluded (``harness_work``).

    With ``provenance_key`` it also follows what custom kernels wrote: storages a launch changed
    (``LaunchCounter`` marks them) and everything computed from them are ``written``; every other
    op's output, and the whole of a view it wrote into, is fingerprinted (``pytorch_outputs``), so
    ``pytorch_source`` can tell an output whose values PyTorch made from data no kernel touched."""

    def __init__(self, provenance_key: int | None = None) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()
        self.elements: Counter[str] = Counter()
        self.path: list[str] = []
        self._harness_depth = 0
        self.provenance_key = provenance_key
        self.written: set[int] = set()  # storages holding what custom kernels computed
        self.pytorch_outputs: dict[tuple[int, tuple[int, ...], torch.dtype], str] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = func.overloadpacket.__name__
        result = func(*args, **(kwargs or {}))
        if not self._harness_depth:
            inputs = tensors.tensors_in((args, kwargs or {}))
            self.calls[name] += 1
            self.elements[name] += sum(t.numel() for t in inputs)
            if is_compute_op(name):
                self.path.append(name)
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

    def pytorch_source(self, output: Any) -> str | None:
        """How PyTorch, not a custom kernel, made every output tensor, when it did: computed from
        data no custom kernel wrote (``cat`` of PyTorch pieces), or, value for value, some PyTorch
        op's own result (routed past a kernel's output with ``torch.where`` or ``+ out * 0``).
        None: a custom kernel's result reaches an output."""
        outs = [t for t in tensors.tensors_in(output) if t.layout == torch.strided]
        if not outs:
            return None
        if not any(_storage(t) in self.written for t in outs):
            return "computed from data no custom kernel wrote"
        outs = [t for t in outs if t.numel() > 1]  # a lone number can match by chance
        with self.harness_work():
            sources = [self.pytorch_outputs.get(self._identity(t)) for t in outs]
        if outs and all(sources):
            return f"value for value what PyTorch's {', '.join(sorted(set(sources)))} computed from data no custom kernel wrote"
        return None

    @contextlib.contextmanager
    def harness_work(self) -> Iterator[None]:
        self._harness_depth += 1
        try:
            yield
        finally:
            self._harness_depth -= 1

    def compute_ops(self) -> dict[str, dict[str, int]]:
        return {name: {"calls": n, "elements": self.elements[name]} for name, n in sorted(self.calls.items()) if is_compute_op(name)}


class LaunchCounter:
    def __init__(self) -> None:
        self.launches: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()
        self.knockout = False
        self.poisoned = 0
        self.recorder: OpRecorder | None = None  # while set, launches join its path

    @property
    def total(self) -> int:
        return sum(self.launches.values())

    def around(self, label: str, call: Callable[[], Any], args: Any, kwargs: Any) -> Any:
        """Count one launch; in knockout mode, poison every tensor it wrote and returned."""
        self.launches[label] += 1
        recorder = self.recorder
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
            written = [t for t, old in zip(inputs, before) if not tensors.same_bits(t, old)]
            kept = [(t, old) for t, old in zip(inputs, before) if tensors.same_bits(t, old)]
            if kept:
                for t, _ in kept:
                    tensors.poison_(t)
                poisoned = [t.clone() for t, _ in kept]
                call()
                _synchronize()
                for (t, old), poison in zip(kept, poisoned):
                    if tensors.same_bits(t, poison):
                        t.copy_(old)  # only read: as it was
                    else:
                        written.append(t)
            for t in written + tensors.tensors_in(result):
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
            original = cls.run

            def run(fn_self, *args, _original=original, **kwargs):  # type: ignore[no-untyped-def]
                if kwargs.get("warmup"):
                    return _original(fn_self, *args, **kwargs)
                label = f"triton:{getattr(getattr(fn_self, 'fn', None), '__name__', 'kernel')}"
                return self.around(label, lambda: _original(fn_self, *args, **kwargs), args, kwargs)

            cls.run = run

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
        "builtins.open": builtins.open, "builtins.print": builtins.print,
        "torch.cuda.synchronize": torch.cuda.synchronize, "torch.cuda.Event": torch.cuda.Event,
        "torch.cuda.Event.record": torch.cuda.Event.record,
        "torch.cuda.Event.elapsed_time": torch.cuda.Event.elapsed_time,
        "torch.cuda.Event.synchronize": torch.cuda.Event.synchronize,
        "torch.cuda.current_stream": torch.cuda.current_stream,
    }
    return watched


class IntegritySnapshot:
    """Identity of every function the harness trusts, taken before the candidate is imported."""

    def __init__(self) -> None:
        self.expected = _watched_functions()
        self.flags = precision_flags()

    def replaced(self) -> list[str]:
        now = _watched_functions()
        return [name for name, fn in self.expected.items() if now.get(name) is not fn]

    def precision_changes(self) -> list[str]:
        now = precision_flags()
        return [f"{k}: {self.flags[k]} -> {now[k]}" for k in self.flags if now[k] != self.flags[k]]


def precision_flags() -> dict[str, Any]:
    return {
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
        "cuda.matmul.allow_fp16_reduced_precision_reduction": torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
        "cuda.matmul.allow_bf16_reduced_precision_reduction": torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
        "default_dtype": str(torch.get_default_dtype()),
    }
