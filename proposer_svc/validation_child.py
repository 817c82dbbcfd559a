"""Entry point of a sandboxed validation child: ``python -m proposer_svc.validation_child WORKDIR DEVICE``.

A proposed module is untrusted code: this process imports it, runs it and checks that it is a
task worth posing (it runs, no NaN/Inf, not constant, deterministic, its output depends on every
input, on the input seed and on the parameters, its runtime lies within bounds). It is a pooled
child (``services.children.entry``: torch imported first, then one job from stdin) and answers
``{"valid", "rule", "reason", "graph_hash", "details"}``. The first failed
check decides the rule; ``details`` keeps the numbers gathered up to then.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from services.children import tensors
from services.children.device import gpu_lock
from services.children.entry import serve
from services.children.loading import import_file
from services.children.models import build_model, make_init_inputs
from services.children.ops import OpRecorder
from services.outcomes import Rejected


class GraphRecorder(OpRecorder):
    """Also hashes the op sequence with each op's tensor shapes and dtypes: identical for two
    modules that compute the same graph whatever their identifiers, source layout or constants."""

    def __init__(self) -> None:
        super().__init__()
        self.digest = hashlib.sha256()
        self.ops = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        signature = [(tuple(t.shape), str(t.dtype)) for t in tensors.tensors_in((args, kwargs or {}))]
        self.digest.update(f"{func}{signature};".encode())
        self.ops += 1
        return super().__torch_dispatch__(func, types, args, kwargs)


def _failure(exc: BaseException, during: str) -> Rejected:
    text = str(exc)
    if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in text.lower() or "can't allocate memory" in text:
        return Rejected("runtime_error", f"ran out of memory {during}")
    return Rejected("runtime_error", f"{type(exc).__name__} {during}: {text}"[:1000])


def _guarded(during: str, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except BaseException as exc:  # SystemExit too: the module must not end the check
        raise _failure(exc, during) from exc


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


# The checks below read outputs through reductions and chunks: an output may be most of the
# memory the child is allowed, so no check may allocate another tensor of its size.
_CHUNK = 1 << 22


def _chunks(t: torch.Tensor) -> list[torch.Tensor]:
    flat = t.reshape(-1)
    return [flat[i : i + _CHUNK] for i in range(0, flat.numel(), _CHUNK)]


def _scale(outputs: list[torch.Tensor]) -> float:
    values = [
        max(abs(float(lo)), abs(float(hi)))
        for t in outputs
        if t.numel() and t.is_floating_point()
        for lo, hi in [torch.aminmax(t)]
    ]
    return max(values, default=0.0)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)


def nonfinite_count(t: torch.Tensor) -> int:
    if not (t.is_floating_point() or t.is_complex()):
        return 0
    wide = torch.complex128 if t.is_complex() else torch.float64
    # A chunk whose wide sum is finite holds no NaN or Inf; only the others are counted.
    return sum(int((~torch.isfinite(c)).sum()) for c in _chunks(t) if not bool(torch.isfinite(c.sum(dtype=wide))))


def relative_change(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """Largest elementwise difference relative to the outputs' magnitude; inf for a changed shape,
    dtype or integer value."""
    if len(a) != len(b):
        return float("inf")
    scale = max(_scale(a), _scale(b), 1e-30)
    worst = 0.0
    for x, y in zip(a, b):
        if x.shape != y.shape or x.dtype != y.dtype:
            return float("inf")
        if x.is_floating_point():
            for cx, cy in zip(_chunks(x), _chunks(y)):
                worst = max(worst, float((cx - cy).abs().max()) / scale)
        elif not torch.equal(x, y):
            return float("inf")
    return worst


def _constant_reason(outputs: list[torch.Tensor], rtol: float) -> str | None:
    for k, t in enumerate(outputs):
        if t.numel() < 2:
            continue  # a scalar (a loss) is judged by how it varies across seeds instead
        if t.dtype == torch.bool:
            if bool(t.all()) or not bool(t.any()):
                return f"every one of the {t.numel()} values of output {k} is {bool(t.reshape(-1)[0])}"
            continue
        if t.is_complex():
            continue
        lo, hi = (float(v) for v in torch.aminmax(t))
        if lo == hi:
            return f"every one of the {t.numel()} values of output {k} equals {lo:.6g}"
        spread = (hi - lo) / max(abs(hi), abs(lo))
        if t.is_floating_point() and spread < rtol:
            return f"output {k} is near-constant: its values span {spread:.2e} of their magnitude (< {rtol:g})"
        if t.is_floating_point():
            tol = tensors.default_tolerance(t.dtype)  # a softmax over 262,144 values: every one within atol of 0
            blind = tensors.constant_within_tolerance(t.detach(), tol, tol, (0.0, (lo + hi) / 2))
            if blind is not None:
                return (
                    f"a constant {blind:.6g} is within the reward's tolerance of every one of the {t.numel()} values of "
                    f"output {k} (they span {lo:.3g} to {hi:.3g}): a wrong kernel could not be told from a right one"
                )
    return None


def _perturbed(original: torch.Tensor, resampled: torch.Tensor, seed: int) -> torch.Tensor | None:
    """Another value for one input: a fresh draw from get_inputs(), or noise where that input does
    not depend on the seed; None where there is no meaningful way to change it (fixed integers)."""
    if not _same(original, resampled):
        return resampled
    if original.is_floating_point():
        generator = torch.Generator(device="cpu").manual_seed(seed)
        noise = torch.randn(original.shape, generator=generator, dtype=torch.float32).to(original.device, original.dtype)
        return original + noise * (0.1 * float(original.abs().mean()) + 0.1)
    if original.dtype == torch.bool:
        return ~original
    return None


class Checker:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.device: str = spec["device"]
        self.details: dict[str, Any] = {}
        self.timings_ms: list[float] = []
        self.last_ms = 0.0

    def forward(self, model: torch.nn.Module, inputs: list[Any], during: str, timed: bool = True) -> list[torch.Tensor]:
        def call() -> Any:
            with torch.no_grad():
                return model(*tensors.clone(inputs))  # clone: a module that mutates its inputs changes nothing here

        _sync(self.device)
        start = time.perf_counter()
        output = _guarded(during, call)
        _sync(self.device)
        self.last_ms = (time.perf_counter() - start) * 1e3
        if timed:
            self.timings_ms.append(self.last_ms)
            self.stop_if_hopeless()
        outs = tensors.tensors_in(output)
        if not outs:
            raise Rejected("output_type", f"forward returned no tensor ({type(output).__name__})")
        return outs

    def stop_if_hopeless(self) -> None:
        """Far above the bound already: stop before the remaining passes."""
        max_ms = self.spec.get("max_ms")
        if max_ms and self.last_ms > 3 * max_ms:
            self.details["runtime_ms"] = self.last_ms
            raise Rejected("too_slow", f"one forward pass took {self.last_ms:.1f} ms, far above the {max_ms:g} ms bound")

    def inputs(self, module: Any, seed: int) -> list[Any]:
        def draw() -> list[Any]:
            torch.manual_seed(seed)
            return list(module.get_inputs())

        return tensors.to_device(_guarded("in get_inputs()", draw), self.device)

    def model(self, module: Any, weight_seed: int) -> torch.nn.Module:
        init = _guarded("in get_init_inputs()", lambda: make_init_inputs(module, weight_seed))
        model = _guarded("building Model", lambda: build_model(module, "Model", weight_seed, self.device, init))
        if not isinstance(model, torch.nn.Module):
            raise Rejected("structure", f"Model is not a torch.nn.Module ({type(model).__name__})")
        return model

    def run(self) -> tuple[torch.nn.Module, list[Any]]:
        """Every check but the runtime bound; returns the model and inputs to time."""
        spec, d = self.spec, self.details
        module = _guarded_load(Path(spec["module_path"]))
        for name in ("Model", "get_inputs", "get_init_inputs"):
            if not hasattr(module, name):
                raise Rejected("structure", f"the module defines no {name} when run")
        seed_a, seed_b = spec["input_seeds"]
        weight_a, weight_b = spec["weight_seeds"]
        model = self.model(module, weight_a)
        d["parameters"] = sum(p.numel() for p in model.parameters())
        base = self.inputs(module, seed_a)
        d["input_shapes"] = [list(t.shape) if isinstance(t, torch.Tensor) else repr(t)[:50] for t in base]
        d["input_dtypes"] = [str(t.dtype) if isinstance(t, torch.Tensor) else type(t).__name__ for t in base]

        recorder = GraphRecorder()
        with recorder:  # the first pass also warms up
            out = self.forward(model, base, "in forward", timed=False)
        d["output_shapes"] = [list(t.shape) for t in out]
        d["output_dtypes"] = [str(t.dtype) for t in out]
        d["ops"] = recorder.ops
        d["compute_ops"] = {name: v["calls"] for name, v in recorder.compute_ops().items()}
        recorder.digest.update(json.dumps([d["input_shapes"], d["output_shapes"], d["output_dtypes"]]).encode())
        graph_hash = recorder.digest.hexdigest()
        d["graph_hash"] = graph_hash

        nonfinite = sum(nonfinite_count(t) for t in out)
        if nonfinite:
            total = sum(t.numel() for t in out)
            raise Rejected("nan_inf", f"{nonfinite} of {total} output values are NaN or Inf")
        constant = _constant_reason(out, spec["near_constant_rtol"])
        if constant:
            raise Rejected("near_constant", constant)

        noise = relative_change(out, self.forward(model, base, "in forward (second run)"))
        d["nondeterminism"] = noise
        if noise > spec["nondeterminism_rtol"]:
            raise Rejected("nondeterministic", f"two runs on the same inputs differ by {noise:.2e} of the output's magnitude")
        threshold = max(spec["change_rtol"], 2 * noise)

        other = self.inputs(module, seed_b)
        if all(_same(x, y) if isinstance(x, torch.Tensor) else x == y for x, y in zip(base, other)):
            raise Rejected("seed_invariant", "get_inputs() returns the same inputs for every seed")
        change = relative_change(out, self.forward(model, other, "in forward (inputs of another seed)"))
        d["seed_change"] = change
        if change <= threshold:
            raise Rejected(
                "seed_invariant", f"the output is the same for inputs drawn with different seeds (change {change:.2e})"
            )

        tensor_slots = [i for i, t in enumerate(base) if isinstance(t, torch.Tensor)]
        if len(tensor_slots) > 1:  # with one input the seed check above already covered it
            for i in tensor_slots:
                replacement = _perturbed(base[i], other[i], seed_b + i)
                if replacement is None:
                    continue
                changed_inputs = list(base)
                changed_inputs[i] = replacement
                change = relative_change(out, self.forward(model, changed_inputs, f"in forward (input {i} changed)"))
                if change <= threshold:
                    raise Rejected(
                        "input_unused",
                        f"the output does not change when input {i} (shape {d['input_shapes'][i]}) changes (change {change:.2e})",
                    )

        if d["parameters"]:
            other_model = self.model(module, weight_b)
            with torch.no_grad():
                for p, q in zip(model.parameters(), other_model.parameters()):
                    fresh = _perturbed(p, q, weight_b) if p.shape == q.shape else None
                    if fresh is not None and fresh is not q:
                        q.copy_(fresh)  # deterministic initialisers (norm weights, zero biases) get noise
            change = relative_change(out, self.forward(other_model, base, "in forward (re-initialised parameters)"))
            d["parameter_change"] = change
            if change <= threshold:
                raise Rejected(
                    "parameters_unused",
                    f"the output does not change when the {d['parameters']} parameters are re-initialised (change {change:.2e})",
                )
            del other_model
        return model, base

    def time(self, model: torch.nn.Module, base: list[Any]) -> None:
        spec, d = self.spec, self.details
        if self.device == "cuda":
            from services.children.timing import time_gpu

            with torch.no_grad():
                timing = _guarded("while timing", lambda: time_gpu(lambda: model(*base), budget_s=spec["gpu_timing_budget_s"]))
            runtime = timing["median_ms"]
        else:
            while len(self.timings_ms) < spec["timed_runs"]:
                self.forward(model, base, "in forward (timing)")
            runtime = statistics.median(self.timings_ms)
        d["runtime_ms"] = runtime
        d["timing_runs"] = len(self.timings_ms) if self.device != "cuda" else timing["samples"]
        if spec.get("max_ms") and runtime > spec["max_ms"]:
            raise Rejected("too_slow", f"median runtime {runtime:.2f} ms is above the {spec['max_ms']:g} ms bound")
        if spec.get("min_ms") and runtime < spec["min_ms"]:
            raise Rejected("too_fast", f"median runtime {runtime:.4f} ms is below the {spec['min_ms']:g} ms bound")


def _guarded_load(path: Path) -> Any:
    try:
        return import_file(path, "kz_proposed")
    except BaseException as exc:
        raise Rejected("load_error", f"importing the module raised {type(exc).__name__}: {exc}"[:1000]) from exc


def check(spec: dict[str, Any]) -> dict[str, Any]:
    checker = Checker(spec)
    lock = spec.get("gpu_lock")
    try:  # shared while checking, exclusive while timing: as the reward service's children do
        with gpu_lock(lock):
            model, base = checker.run()
        with gpu_lock(lock, exclusive=True):
            checker.time(model, base)
        result = {"valid": True, "rule": None, "reason": "passed every check"}
    except Exception as exc:  # a failure of the checks themselves (out of memory in them) is a verdict too
        rejection = exc if isinstance(exc, Rejected) else _failure(exc, "while checking its output")
        result = {"valid": False, "rule": rejection.rule, "reason": rejection.reason}
        cause = exc.__cause__ if isinstance(exc, Rejected) else exc
        if cause is not None:
            checker.details["traceback"] = "".join(traceback.format_exception(cause)[-4:])[-1500:]
    details = checker.details
    return {**result, "graph_hash": details.pop("graph_hash", None), "details": details}


def warm_up(device: str) -> None:
    """torch (and CUDA) only: the reward child's warm-up also imports dynamo and Triton, which
    doubles a child's start-up CPU and a module check needs neither."""
    if device == "cuda":
        torch.cuda.init()
        torch.empty(1, device="cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


if __name__ == "__main__":
    serve(lambda spec, workdir, device: check({**spec, "device": device}), warm_up)
