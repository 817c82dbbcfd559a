"""The candidate role: import ``ModelNew``, run it on the reference's inputs, record evidence, time it.

This process never sees the reference module, its outputs or its input seed. It records what
the verdict needs: the outputs of every trial (judged by the worker) and of the last timed call
(a forward that knows it is being timed must still compute), the custom-kernel launches,
the outputs of the *knockout* trials (custom kernels' results poisoned: one trial, the worker's
secret pick, and its recall after the refresh), late writes after return,
input mutation, stray threads, replaced harness functions, changed precision flags.
Each trial's output is written as soon as it is final (one output in host memory at a time: a
KernelBench level-1 output is 6.4 GB), with a keyed fingerprint taken on the device at that
moment; the judge checks each file against it, so candidate code that runs later (the next trial,
timing) cannot rewrite an earlier answer. The process exits without running finalizers.

What the candidate hands back is checked before the harness touches it: plain tensors in plain
containers, no attributes set on a tensor (an instance attribute shadows a method the harness
calls), the current stream and device as they were. The hooks are installed, the integrity
snapshot taken and the audit hook armed before the candidate is imported.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import gc
import math
import os
import socket
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from reward_svc.compile import CompileLog, install_fast_load_inline
from reward_svc.harness.instrument import IntegritySnapshot, LaunchCounter, install_audit_hook
from reward_svc.harness.judged import judged_conditions
from reward_svc.harness.reference import timing_rotation
from reward_svc.policy import check_native_sources
from reward_svc.protocol import CandidateResult, CandidateSpec, KnockoutObservations, Observations
from services.children import device_exchange, tensors
from services.children.device import device_released, gpu_lock
from services.children.device_exchange import Sender
from services.children.loading import import_file
from services.children.models import build_model
from services.children.ops import OpRecorder
from services.children.phases import HoldSplit, Phases
from services.children.report import AUDIT_LOG
from services.children.timing import TimedCheck, Timing
from services.outcomes import Rejected

COMPILE_ONLY_MARK = "compiled only"
SKIPPED = object()  # a trial the harness did not run (a forward that returns None has an output: None)


def _install_compile_hooks(counter: LaunchCounter, spec: CandidateSpec, workdir: Path) -> CompileLog:
    """Route load_inline through the cached fast path and count calls into what it builds; the log of its builds."""
    import torch.utils.cpp_extension as cpp_extension

    compile_only = spec["device"] != "cuda"
    if spec.get("compile_cache_readonly"):  # its source's published build: what it lacks builds in the work dir
        builds = install_fast_load_inline(workdir / "build", compile_only=compile_only, layers=[Path(spec["compile_cache"])])
    else:
        builds = install_fast_load_inline(Path(spec["compile_cache"]), compile_only=compile_only)
    if spec["device"] == "cuda":  # the interpreter compiles nothing: no Triton build to keep
        _route_triton_cache(Path(spec["compile_cache"]), readonly=bool(spec.get("compile_cache_readonly")))
        _compile_triton_off_device()
    fast = cpp_extension.load_inline

    def load_inline(name: str, *args: Any, **kwargs: Any) -> Any:
        violation = check_native_sources(*args, **kwargs)
        if violation:  # kept, so a candidate that catches the rejection is still judged by it
            counter.refused_sources.append(f"the sources of {name!r} {violation}"[:500])
            raise Rejected("native_policy", f"the load_inline sources of {name!r} {violation}")
        module = fast(name, *args, **kwargs)
        return counter.wrap_extension(module, name) if kwargs.get("is_python_module", True) else module

    cpp_extension.load_inline = load_inline
    return builds


def _route_triton_cache(compile_cache: Path, *, readonly: bool) -> None:
    """A source evaluated before reads its published Triton build (read-only); a new one builds into
    its own build dir, which the worker publishes after a clean run (see harness/triton_cache.py)."""
    from reward_svc.harness.triton_cache import LAYERS_ENV

    triton_dir = compile_cache / "triton"
    if readonly:
        os.environ[LAYERS_ENV] = os.pathsep.join([str(triton_dir), os.environ.get(LAYERS_ENV, "")])
    else:
        triton_dir.mkdir(parents=True, exist_ok=True)
        os.environ["TRITON_CACHE_DIR"] = str(triton_dir)


def _compile_triton_off_device() -> None:
    """Triton compiles a kernel at its first launch, inside the trials' device hold: the compile
    (CPU, up to seconds) lets the hold go, so other jobs' timing does not wait for it."""
    try:
        from triton.runtime.jit import JITFunction
    except ImportError:
        return
    compile_kernel = JITFunction._do_compile

    def _do_compile(fn_self: Any, *args: Any, **kwargs: Any) -> Any:
        with device_released():
            return compile_kernel(fn_self, *args, **kwargs)

    JITFunction._do_compile = _do_compile


def _first_autotune_config_when_interpreted() -> None:
    """The Triton interpreter has no benchmarker: an ``@triton.autotune`` with several configs runs its
    first one there (correctness does not depend on the choice; speed is not measured on CPU)."""
    try:
        from triton.runtime.autotuner import Autotuner
    except ImportError:
        return
    init = Autotuner.__init__

    @functools.wraps(init)
    def first_config(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.configs = self.configs[:1]

    Autotuner.__init__ = first_config


def _is_compile_error(exc: BaseException) -> bool:
    names = {cls.__name__ for cls in type(exc).__mro__}
    return bool(
        names & {"CompilationError", "CompileError", "SyntaxError", "IndentationError"}
    ) or "Error building extension" in str(exc)


def _failure(exc: BaseException, during: str, observations: Observations | None = None) -> CandidateResult:
    result: CandidateResult = {} if observations is None else {"observations": observations}
    try:  # the candidate's exception: its __str__ is its code, and may raise
        tail = "".join(traceback.format_exception(exc)[-6:])[-2000:]
        str(exc)
    except Exception:
        result.update({"status": "runtime_error", "reason": f"{type(exc).__name__} {during} (its message cannot be shown)"})
        return result
    if type(exc).__name__ == "ToolchainUnavailable":  # this machine lacks a header the source needs: not the candidate's fault
        result.update({"status": "unverified", "reason": f"not checked here: {exc}"[:2000], "traceback": tail})
    elif _is_compile_error(exc):
        result.update({"status": "compile_error", "reason": f"compile error {during}: {exc}"[:2000], "traceback": tail})
    elif isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower():
        result.update({"status": "runtime_error", "reason": f"out of memory {during}", "traceback": tail, "out_of_memory": True})
    else:
        result.update({"status": "runtime_error", "reason": f"{type(exc).__name__} {during}: {exc}"[:2000], "traceback": tail})
    return result


class TrialOutputs:
    """Trial outputs on their way to the judge: each is fingerprinted where it was computed, inside
    the trial's device hold (``take``), then copied to the host, written and let go after it
    (``write``). The copy (CPU work: a GB output is seconds on a busy host) is out of the hold, where a
    timing waiting for the device would drain behind it; no code of the candidate's runs between the
    two, and the judge holds the file to the fingerprint. With ``in_flight``, a file is published
    (renamed into place, whole) only once fewer than that many published ones wait for the judge,
    which takes them while this child runs; after ``wait_s`` it is published anyway (the judge is
    late, not gone)."""

    POLL_S = 0.005

    def __init__(
        self,
        workdir: Path,
        key: int,
        in_flight: int | None = None,
        sender: Sender | None = None,
        exchange_fallback: str | None = None,
        wait_s: float = 60.0,
    ) -> None:
        self.workdir, self.key = workdir, key
        self.in_flight, self.wait_s, self.sender = in_flight, wait_s, sender
        self.exchange_fallback = exchange_fallback  # why outputs the device exchange would take go as files
        self.fingerprints: dict[str, list[int]] = {}
        self._at_return: list[int] | None = None

    def returned(self, output: Any) -> None:
        """What a judged call returned, fingerprinted the moment it returned (``check_returned`` passed):
        the bytes its trial's checks look at, and the ones ``take`` must still find."""
        self._at_return = tensors.fingerprint(output, self.key)

    def take(self, name: str, output: Any) -> tuple[str, Any]:
        """The output's fingerprint for the judge, once it is final. Candidate code can run between the
        call's return and here (a finalizer: a generator or a tensor hook let go of by the harness),
        outside anything recorded: an output it changed is refused, not judged."""
        fingerprint, at_return, self._at_return = tensors.fingerprint(output, self.key), self._at_return, None
        if at_return is None:
            raise RuntimeError(f"harness: {name} was taken without its fingerprint from when forward returned")
        if fingerprint != at_return:
            raise Rejected(
                "late_write",
                "the output changed after forward returned and its checks ran: candidate code ran outside forward "
                "(a finalizer, a hook) and wrote it",
            )
        self.fingerprints[name] = fingerprint
        return name, output

    def write(self, taken: tuple[str, Any]) -> None:
        name, output = taken
        found = tensors.tensors_in(output)
        if self.sender is not None and self.sender.takes(found):  # a GB-sized output stays on the device
            try:
                self.sender.send(name, found)
                return
            except Exception as exc:  # no device memory to export into, the judge's end gone, or worse: the file path holds
                self.sender, self.exchange_fallback = None, f"sending {name}: {_failure_name(exc)}"
        part = self.workdir / f"{name}.pt.part"
        tensors.save(part, output)  # a device tensor's copy to the host is made here
        self._wait_for_the_judge()
        os.replace(part, self.workdir / f"{name}.pt")

    def _wait_for_the_judge(self) -> None:
        deadline = time.monotonic() + self.wait_s
        while self.in_flight and len(list(self.workdir.glob("output_*.pt"))) >= self.in_flight and time.monotonic() < deadline:
            time.sleep(self.POLL_S)


def _failure_name(exc: BaseException) -> str:
    """What failed, without its message (which may quote the candidate's doing): the driver's or the OS's error name."""
    if isinstance(exc, device_exchange.DeviceExchangeError):
        return exc.error
    if isinstance(exc, OSError) and exc.errno is not None:
        return errno.errorcode.get(exc.errno, type(exc).__name__)
    return type(exc).__name__


def _device_sender(spec: CandidateSpec) -> tuple[Sender | None, str | None]:
    """The device exchange, where the pool gave this child a socket and the driver can export memory; else why
    not, where it was asked for."""
    fd, min_bytes = spec.get("exchange_fd"), spec.get("device_exchange_min_bytes")
    if spec["device"] != "cuda" or fd is None or min_bytes is None:
        return None, None
    if not device_exchange.available():
        return None, "this child cannot export device memory as descriptors"
    hold = functools.partial(gpu_lock, spec.get("gpu_lock"))
    device = torch.device("cuda", torch.cuda.current_device())
    return Sender(socket.socket(fileno=fd), min_bytes, spec.get("outputs_in_flight") or 1, hold=hold, device=device), None


def run_candidate(spec: CandidateSpec, workdir: Path) -> CandidateResult:
    """The result for ``result.json``; the trials' outputs are in ``workdir`` by then."""
    device = spec["device"]
    exchange = Path(spec["exchange_dir"])
    phases, holds = Phases(), HoldSplit()
    counter = LaunchCounter()
    counter.copies_are_work = bool(spec.get("copies_are_work"))
    counter.install_triton()
    builds = _install_compile_hooks(counter, spec, workdir)
    if device != "cuda":
        _first_autotune_config_when_interpreted()
    sender, unavailable = _device_sender(spec)
    writable = [str(workdir), os.environ.get("TMPDIR", "/tmp"), "/tmp"]
    arm_audit = install_audit_hook(str(workdir / AUDIT_LOG), writable, sender.sock if sender else None)
    snapshot = IntegritySnapshot()  # once the hooks are in: they are part of what must stay as it is
    baseline_threads = threading.active_count()
    outputs = TrialOutputs(workdir, spec["fingerprint_key"], spec.get("outputs_in_flight"), sender, unavailable)
    observations: Observations = {"launches_per_case": [], "work_per_case": []}

    # Off for the candidate's life here, collected only between trials: a collection at any allocation
    # would run the candidate's finalizers (a generator's ``finally``, a tensor hook's closure) at a point of
    # its choosing inside the harness, between a judged call's return and its output's fingerprint.
    gc.disable()
    arm_audit()
    try:
        module = import_file(Path(spec["candidate_path"]), "kz_candidate")
    except Rejected as rejection:
        return {"status": "rejected", "guard": rejection.rule, "reason": rejection.reason, "observations": observations}
    except Exception as exc:
        failed = _failure(exc, "while importing the candidate")
        failed["builds"] = builds.to_json()  # which header tiers a compile error met
        return failed
    if not hasattr(module, "ModelNew"):
        return {"status": "compile_error", "reason": "the candidate defines no ModelNew"}

    models: dict[int, torch.nn.Module] = {}
    # by their shapes, the latest clean trial's inputs: the refresh writes into those of its own shapes
    # (earlier ones of the same shapes are let go: a level-2 case's inputs are GBs on the device)
    case_args: dict[tuple[torch.Size, ...], Any] = {}
    phases.lap("import")  # load_inline compiled here, outside the lock; Triton compiles at its first launch
    lock = spec.get("gpu_lock")

    def trial(name: str, run: Callable[[Any], Any], case: int) -> None:
        """One candidate call on ``case``'s inputs under the device hold (a timing waiting for the device
        waits for one call, not all); its output is written before the next call runs. Whatever forward
        returned is its output, None too: only the harness skips a trial (``SKIPPED``). The inputs are
        copied to the device before the hold, as outputs are copied after it: a copy engine's transfer
        is not the kernels' work a timing must not share the GPU with, and a GB of inputs is seconds of
        host work a waiting timing would drain behind."""
        gc.collect(0)  # the last call's cycles: their finalizers run now, where no judged output is in the making
        # The case's model, built the first time (later: the one built then). ModelNew's constructor draws its
        # weights on the host (seconds for a large Linear): not the device work the hold is for, and candidate
        # code as the import is, which runs outside it too. Before the case's inputs are loaded: no unrecorded
        # candidate code runs while a case's values are in the process.
        with judged_conditions():
            _model_for(module, models, spec, exchange, case)
        phases.lap("model")
        args = _case_inputs(spec, exchange, case)
        phases.lap("inputs")
        with phases.on_device(lock, "trials"):
            holds.start()
            out = run(args)
            holds.lap(trial_kind(name))
            taken = None if out is SKIPPED else outputs.take(name, out)
            del out
            holds.lap("take")
        _check_integrity(snapshot, observations)
        if taken is not None:
            outputs.write(taken)
            phases.lap("outputs")

    paths: dict[str, list[str]] = {}  # the ops and launches of the knockout case's runs, by trial
    run_case = functools.partial(_run_case, module, models, spec, exchange, counter, outputs, observations, baseline_threads)
    knockout = functools.partial(_knockout_trial, module, models, spec, exchange, counter, outputs, observations, paths)
    try:
        with torch.no_grad():
            for case in range(min(spec["trials"], len(spec["weight_seeds"]))):
                trial("warm-up", functools.partial(_warm_up, module, models, spec, exchange, case), case)
            knockout_case = spec["knockout_case"]
            for case in range(spec["trials"]):
                if case == knockout_case:
                    trial("output_knockout", functools.partial(knockout, "knockout"), case)
                else:
                    trial(f"output_{case}", functools.partial(run_case, case, case_args=case_args), case)
            refresh = functools.partial(_refresh_trial, run_case, spec, case_args, counter, paths, observations)
            trial("output_refresh", refresh, knockout_case)
            trial("output_recall", functools.partial(knockout, "recall"), knockout_case)
            for name, seen in observations.get("knockouts", {}).items():
                if "raised" not in seen and "refused" not in seen:
                    seen["path"] = _compare_paths(paths, name)
    except Rejected as rejection:
        return {"status": "rejected", "guard": rejection.rule, "reason": rejection.reason, "observations": observations}
    except Exception as exc:
        if COMPILE_ONLY_MARK in str(exc):
            return {
                "status": "unverified",
                "reason": "the CUDA source compiles with nvcc; running it needs a GPU (none here)",
                "observations": _finish_observations(observations, counter, snapshot),
                "builds": builds.to_json(),
            }
        return _failure(exc, "while running ModelNew", observations)

    observations = _finish_observations(observations, counter, snapshot)
    result: CandidateResult = {
        "status": "ok",
        "observations": observations,
        "phases": phases.seconds,
        "trial_holds": holds.seconds,
        "output_fingerprints": outputs.fingerprints,
        "builds": builds.to_json(),
    }
    if device == "cuda" and spec.get("time") and not observations["replaced_functions"]:
        try:
            result["timing"] = _time_candidate(
                lambda case: _model_for(module, models, spec, exchange, case), spec, exchange, counter, outputs, phases, lock
            )
        except Rejected as rejection:
            return {"status": "rejected", "guard": rejection.rule, "reason": rejection.reason, "observations": observations}
        except Exception as exc:
            return _failure(exc, "while timing ModelNew", observations)
        _check_integrity(snapshot, observations)
        observations["replaced_functions"] = observations.get("replaced_functions") or snapshot.replaced()
    if device == "cuda":
        result["device_peak_bytes"] = torch.cuda.max_memory_reserved()
    if outputs.exchange_fallback:
        result["device_exchange_fallback"] = outputs.exchange_fallback
    return result


def trial_kind(name: str) -> str:
    """What a trial's hold ran, from its output's name: ``warm-up``, ``trial`` (a case's own run),
    ``knockout``, ``refresh`` or ``recall``."""
    kind = name.removeprefix("output_")
    return "trial" if kind.isdigit() else kind


def _check_integrity(snapshot: IntegritySnapshot, observations: Observations) -> None:
    """After every call into the candidate: the harness's code and hooks are still its own (the
    first replacement seen is kept, even if the candidate puts the original back later)."""
    if not observations.get("replaced_functions"):
        replaced = snapshot.replaced()
        if replaced:
            observations["replaced_functions"] = replaced


def _time_candidate(
    model_for: Callable[[int], torch.nn.Module],
    spec: CandidateSpec,
    exchange: Path,
    counter: LaunchCounter,
    outputs: TrialOutputs,
    phases: Phases,
    lock: Any,
) -> Timing:
    """Timing on inputs whose values change from call to call (the correctness cases' values, written
    into the same tensors in turn: a result cached on the tensors' identity is stale), with the
    custom launches of the timed calls counted, then one more call on another case's values whose
    output the judge holds to that case's answer (``output_timed_<case>``). The timed model holds
    case 0's weights; the check runs on a case with the same weights where there is one."""
    from services.children.timing import time_gpu

    rotation = timing_rotation(exchange, spec["trials"])
    model = model_for(rotation[0])
    position = check_position(rotation, len(spec["weight_seeds"]))
    sets = [_case_inputs(spec, exchange, case) for case in rotation]  # copies to the device: before the hold
    phases.lap("inputs")
    with phases.on_device(lock, "timing_setup"):
        args = tensors.clone(sets[0])
    targets = tensors.tensors_in(args)

    def prepare(call: int) -> None:
        for target, value in zip(targets, tensors.tensors_in(sets[call % len(sets)])):
            target.copy_(value)

    latest: list[Any] = [None]

    def timed_call() -> None:
        latest[0] = model(*args)

    with torch.no_grad(), phases.on_device(lock, "timing", exclusive=True):
        before = counter.total
        gc.enable()  # hundreds of calls: their cycles are collected as before; none of them is judged
        try:
            timing = time_gpu(timed_call, prepare=prepare, budget_s=spec.get("timing_budget_s", 10.0))
        finally:
            gc.disable()
        timing["launches_per_call"] = (counter.total - before) / max(1, timing["calls"])
        # Checked on values neither the first nor the last timed call had (a result remembered from
        # either is stale): the first values once more, then another case's.
        prepare(0)
        timed_call()
        prepare(position)
        checked, timing["check"] = _call_as_timed(model_for(rotation[position]), args, counter, outputs, rotation[position])
        taken = outputs.take(f"output_timed_{rotation[position]}", checked)
        del checked
    latest[0] = None
    outputs.write(taken)
    return timing


def check_position(rotation: list[int], weight_seeds: int) -> int:
    """Where in the timing rotation the check call's case is: another case whose weights are the timed
    model's (case k is built with weight seed k mod their number), else the next one (with its own)."""
    same = [i for i, case in enumerate(rotation) if i and case % weight_seeds == rotation[0] % weight_seeds]
    return same[0] if same else 1 % len(rotation)


def _case_inputs(spec: CandidateSpec, exchange: Path, case: int) -> Any:
    """The reference's inputs for one case, on this child's device."""
    return tensors.load(exchange / f"inputs_{case}.pt", spec["device"])


def _model_for(
    module: Any, models: dict[int, torch.nn.Module], spec: CandidateSpec, exchange: Path, case: int
) -> torch.nn.Module:
    weight_seed = spec["weight_seeds"][case % len(spec["weight_seeds"])]
    if weight_seed not in models:
        init_inputs = tensors.load(exchange / f"init_{case}.pt")
        models[weight_seed] = build_model(module, "ModelNew", weight_seed, spec["device"], init_inputs)
    return models[weight_seed]


def _warm_up(module: Any, models: dict[int, torch.nn.Module], spec: CandidateSpec, exchange: Path, case: int, args: Any) -> Any:
    """One unjudged call of the model a case uses, before any trial: what a forward does once (a weight
    packed, a Triton kernel autotuned, a buffer kept) is done before the knockout, which may then be
    any trial, and never poisons what later calls reuse. Its inputs are the case's shapes and ranges,
    every value drawn afresh (uniformly between the tensor's least and greatest): an answer computed
    here, where nothing is recorded, tells nothing about a trial's (a scaled or rolled copy of the
    case's values let PyTorch compute the trials' answers here)."""
    generator = torch.Generator(device=spec["device"]).manual_seed(spec["fingerprint_key"] ^ case)
    for t in tensors.tensors_in(args):
        if t.numel() < 2:
            continue
        if t.dtype == torch.bool:
            t.copy_(torch.randint(0, 2, t.shape, generator=generator, device=t.device).bool())
        elif t.is_floating_point():
            low, high = (float(v) for v in torch.aminmax(t))
            if math.isfinite(low) and math.isfinite(high) and high > low:
                t.uniform_(low, high, generator=generator)
        elif not t.is_complex():
            low, high = (int(v) for v in torch.aminmax(t))
            if high - low < 1 << 62:
                t.copy_(torch.randint(low, high + 1, t.shape, generator=generator, device=t.device))
    with judged_conditions():
        _model_for(module, models, spec, exchange, case)(*args)
    _settle(spec["device"])
    return SKIPPED


def _run_case(
    module: Any,
    models: dict[int, torch.nn.Module],
    spec: CandidateSpec,
    exchange: Path,
    counter: LaunchCounter,
    outputs: TrialOutputs,
    observations: Observations,
    baseline_threads: int,
    case: int,
    args: Any,
    *,
    case_args: dict[tuple[torch.Size, ...], Any] | None = None,
    recorder: OpRecorder | None = None,
) -> Any:
    """One clean run of a case on ``args``: a trial on its own inputs (which join ``case_args``), or
    the refresh. Its launches and PyTorch's work are the case's."""
    model = _model_for(module, models, spec, exchange, case)
    pristine = tensors.clone(args)
    launches_before = counter.total
    recorder = recorder or OpRecorder()
    streams = _stream_and_device(spec["device"])
    out = _recorded_call(model, args, counter, outputs, recorder, judged_conditions())
    if _stream_and_device(spec["device"]) != streams:
        raise Rejected("harness_tampering", "forward changed the current CUDA stream or device and left it changed")
    if case == 0:
        observations["compute_ops"] = recorder.compute_ops()
    # in case order: the knockout case's clean run, the refresh, comes after the other trials
    observations["work_per_case"].insert(case, recorder.work())
    returned = tensors.clone(out)  # what the caller sees the moment forward returns
    _settle(spec["device"])
    observations["launches_per_case"].insert(case, counter.total - launches_before)
    if not all(tensors.same_bits(a, b) for a, b in zip(tensors.tensors_in(returned), tensors.tensors_in(out))):
        raise Rejected(
            "late_write", "the output changed after forward returned: work was left running on a side stream or thread"
        )
    mutated = [
        i for i, (a, b) in enumerate(zip(tensors.tensors_in(args), tensors.tensors_in(pristine))) if not tensors.same_bits(a, b)
    ]
    if mutated:
        raise Rejected("input_mutation", f"forward modified its input tensor(s) {mutated}")
    if threading.active_count() > baseline_threads:
        raise Rejected("background_thread", "forward left a thread running after it returned")
    if case_args is not None:
        case_args[_shapes(args)] = args
    return out


def _shapes(args: Any) -> tuple[torch.Size, ...]:
    return tuple(t.shape for t in tensors.tensors_in(args))


def check_returned(out: Any, args: Any) -> None:
    """What forward returned, and its inputs, before the harness calls anything on them: plain
    tensors in plain lists, tuples and dicts (a subclass would run its own code inside the harness's
    calls), and no attribute set on any of those tensors (one named like a method shadows it)."""
    for value in tensors.walk(out):
        if not (
            type(value) in (torch.Tensor, torch.nn.Parameter, *tensors.PLAIN_CONTAINERS, int, float, bool, str, type(None))
            or type(value).__module__ == "torch.return_types"
        ):
            raise Rejected(
                "harness_tampering",
                f"forward returned a {type(value).__name__}: outputs are plain tensors in lists, tuples or dicts",
            )
    for t in tensors.tensors_in((out, args)):
        if vars(t):
            raise Rejected(
                "harness_tampering", f"forward set attribute(s) {', '.join(sorted(vars(t)))[:100]} on a tensor the harness reads"
            )


def _stream_and_device(device: str) -> tuple[int, int] | None:
    if device != "cuda":
        return None
    return torch.cuda.current_device(), torch.cuda.current_stream().cuda_stream


def _settle(device: str) -> None:
    """Let anything still in flight land, so a late write is visible."""
    if device == "cuda":
        torch.cuda.synchronize()
    time.sleep(0.005)
    if device == "cuda":
        torch.cuda.synchronize()


def _call_as_timed(
    model: torch.nn.Module, args: Any, counter: LaunchCounter, outputs: TrialOutputs, case: int
) -> tuple[Any, TimedCheck]:
    """A call under the timed calls' conditions (not the judged ones) with PyTorch's work and the custom
    launches recorded as a trial's are: a forward that tells the timed calls from the judged ones (by
    what uninitialised memory holds, say) and has PyTorch do the work while timed shows it here."""
    recorder = OpRecorder()
    launches_before = counter.total
    out = _recorded_call(model, args, counter, outputs, recorder, contextlib.nullcontext())
    return out, {"case": case, "work": recorder.work(), "launches": counter.total - launches_before}


def _recorded_call(
    model: Callable[..., Any],
    args: Any,
    counter: LaunchCounter,
    outputs: TrialOutputs,
    recorder: OpRecorder,
    conditions: contextlib.AbstractContextManager[Any],
) -> Any:
    """``model(*args)`` under ``conditions`` with PyTorch's ops and the custom launches recorded; what it
    returned, checked (``check_returned``) before the harness reads it, and fingerprinted then."""
    counter.recorder = recorder
    try:
        with conditions, recorder:
            out = model(*args)
    finally:
        counter.recorder = None
    check_returned(out, args)
    outputs.returned(out)
    recorder.returned(out)
    return out


def _refresh_trial(
    run_case: Callable[..., Any],
    spec: CandidateSpec,
    case_args: dict[tuple[torch.Size, ...], Any],
    counter: LaunchCounter,
    paths: dict[str, list[str]],
    observations: Observations,
    values: Any,
) -> Any:
    """The knockout case's clean run, after the other trials: its values written into the *same* tensors
    the last of them used (where their shapes match): defeats caches keyed on tensor identity,
    address or shape. It also follows what the custom kernels wrote: an output whose values a
    PyTorch op computed from data they never touched was not theirs, however it was routed
    (``torch.where`` on a test of their output, ``+ out * 0``, a copy kernel)."""
    case = spec["knockout_case"]
    args = case_args.get(_shapes(values))
    if args is None:
        args = values
    else:
        for target, value in zip(tensors.tensors_in(args), tensors.tensors_in(values)):
            target.copy_(value)
    recorder = OpRecorder(spec["fingerprint_key"])
    out = run_case(case, args, recorder=recorder)
    paths["refresh"] = recorder.path
    if counter.total:
        found = recorder.pytorch_source(out)
        if found and found[0] == "copied" and spec["copies_are_work"]:
            # a reference op acts as a copy on these values: an honest kernel of it copies PyTorch's result
            # before it (a clamp whose bounds do not bind, after PyTorch's matmul); the op accounting stands behind
            found = None
        observations["pytorch_output"], observations["pytorch_output_kind"] = (found[1], found[0]) if found else (None, None)
    return out


def _knockout_trial(
    module: Any,
    models: dict[int, torch.nn.Module],
    spec: CandidateSpec,
    exchange: Path,
    counter: LaunchCounter,
    outputs: TrialOutputs,
    observations: Observations,
    paths: dict[str, list[str]],
    name: str,
    args: Any,
) -> Any:
    """Run the knockout case with every custom kernel's writes poisoned and uninitialised memory filled
    with NaN: an output that is still right was not computed by the custom kernels (or was
    remembered from an earlier call, a cache keyed on the inputs' values: the ``recall``, after
    the refresh). The ``knockout`` runs in the trials' place, the first time forward sees the case's
    values: which trial it is no forward can know, so none can keep its kernels for the knockout and
    hand PyTorch the answer in the trials. Glue that cannot take
    wrong values (a Cholesky factor of what is no longer positive-definite) may have a PyTorch op
    refuse them: it returns wrong values of its result's shapes instead (``OpRecorder._stand_in``),
    and where it cannot, the op accounting is the check left, held to the share the knockout would
    have (``refused``). Any other error (forward's own, on what it found in its
    kernels' output) is a forward hiding from the knockout (``raised``)."""
    case = spec["knockout_case"]
    model = _model_for(module, models, spec, exchange, case)
    seen: KnockoutObservations = observations.setdefault("knockouts", {}).setdefault(name, {})
    failed_launches = counter.failures.total()
    recorder = OpRecorder()
    recorder.stand_in_for_refusals = True
    counter.recorder, counter.knockout, counter.copies = recorder, True, 0
    try:
        with judged_conditions(), recorder:
            out = model(*args)
            _settle(spec["device"])
    except Exception as exc:  # the candidate's own error on poisoned values
        if isinstance(exc, torch.OutOfMemoryError):  # the allocator's own (a message is the candidate's to write):
            raise  # device memory other children held, the worker runs it again; never evasion
        raised = f"{type(exc).__name__}: {exc}"[:300]
        if exc is recorder.op_error and counter.failures.total() == failed_launches:  # an op's, not a launch's: refused
            seen["refused"] = raised
        else:
            seen["raised"] = raised
        return SKIPPED
    finally:
        counter.recorder, counter.knockout = None, False
        paths[name] = recorder.path
    check_returned(out, args)
    outputs.returned(out)
    recorder.returned(out)
    seen["copies"] = counter.copies
    if recorder.stood_in:
        seen["stood_in"] = recorder.stood_in[:8]
    return out


def _compare_paths(paths: dict[str, list[str]], knockout: str) -> str | None:
    """Where a knockout took another path than the refresh trial on the same values: a forward
    that looks at what its kernels wrote and, finding it tampered with, hides. None: the same path."""
    clean, poisoned = paths.get("refresh"), paths.get(knockout)
    if clean is None or poisoned is None or clean == poisoned:
        return None
    at = next((i for i, (a, b) in enumerate(zip(clean, poisoned)) if a != b), min(len(clean), len(poisoned)))
    return (
        f"after {', '.join(clean[max(0, at - 3) : at]) or 'the start'}: {', '.join(clean[at : at + 3]) or 'returned'} "
        f"on clean values, {', '.join(poisoned[at : at + 3]) or 'returned'} in the {knockout}"
    )


def _finish_observations(observations: Observations, counter: LaunchCounter, snapshot: IntegritySnapshot) -> Observations:
    finished: Observations = {**observations}
    finished.update(
        {
            "launches": dict(counter.launches),
            "failed_launches": dict(counter.failures),
            "forged_launches": counter.forged,
            "native_policy": counter.refused_sources,
            "replaced_functions": observations.get("replaced_functions") or snapshot.replaced(),
            "precision_changes": snapshot.precision_changes(),
        }
    )
    return finished
