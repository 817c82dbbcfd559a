"""The reference role: make the trial inputs, run ``Model`` on them, time it.

Inputs come from a per-request secret seed that only this process sees; weights come from
per-trial weight seeds that the candidate's process reuses, so ``Model`` and ``ModelNew`` hold the
same parameters. The cases draw ``get_inputs()``'s floating inputs from hidden distributions too
(``CASE_DISTRIBUTIONS``: signed, its own, wider with outliers) where the reference stays finite on
them, so a kernel fitted to ``torch.rand``'s [0, 1) (a ReLU skipped, an exp replaced by a short
polynomial) fails. Inputs go to the exchange directory (the candidate gets a copy); the expected
outputs stay in this child's work directory, read only by the judge. Only GPU work (drawing the
inputs there, running the model) holds the device lock; writing files does not.
"""

from __future__ import annotations

import functools
import math
import os
import shutil
import sys
from pathlib import Path
from typing import Any, NamedTuple

import torch

from reward_svc.protocol import OutputDescription, ReferenceResult, ReferenceSpec
from services.children import tensors
from services.children.device import DeviceLockDescriptors
from services.children.loading import import_file
from services.children.models import build_model, make_init_inputs
from services.children.ops import OpRecorder, Work
from services.children.phases import Phases


def run_reference(spec: ReferenceSpec, workdir: Path) -> ReferenceResult:
    try:
        return _run_reference(spec, workdir)
    except torch.OutOfMemoryError as exc:  # the worker runs it again once other children give their memory back
        return {"status": "out_of_memory", "reason": f"out of {spec['device']} memory: {str(exc).splitlines()[0][:300]}"}


def _run_reference(spec: ReferenceSpec, workdir: Path) -> ReferenceResult:
    device, lock = spec["device"], spec.get("gpu_lock")
    phases = Phases()
    module = import_file(Path(spec["reference_path"]), "kz_reference")
    for name in ("Model", "get_inputs"):
        if not hasattr(module, name):
            return {"status": "invalid_reference", "reason": f"the reference defines no {name}"}
    exchange = workdir / "exchange"
    exchange.mkdir(exist_ok=True)
    if device == "cuda":  # host-side inputs (init inputs, a host fallback) of GB size would take seconds on one thread
        torch.set_num_threads(max(1, min(8, (os.cpu_count() or 2) // 2)))
    phases.lap("import")
    n_cases = spec["trials"]
    models: dict[int, torch.nn.Module] = {}
    recorder = OpRecorder()
    work_per_case: list[Work] = []
    distributions: list[str] = []
    outputs_meta: list[OutputDescription] = []
    output_bytes = files_bytes = 0
    noise: list[list[float] | None] = []  # per case: the judge holds each trial to its own case's noise
    copying: list[list[str]] = []  # per case: its compute ops that acted as a copy on its values
    seen_per_seed: dict[int, Digest] = {}  # per weight seed: its first case's inputs and output
    same_output: dict[int, bool] = {}  # per later case of a seed: whether other inputs gave the first case's output
    case = 0
    with torch.no_grad():
        while case < n_cases:  # one case at a time: a KernelBench level-1 case alone is GBs
            weight_seed = spec["weight_seeds"][case % len(spec["weight_seeds"])]
            init_inputs = make_init_inputs(module, weight_seed)
            inputs = _make_inputs(module, spec["input_seed"] + case, device, phases, lock)
            phases.lap("inputs")
            if weight_seed not in models:  # before the hold: its weights are drawn on the host (seconds for a large Linear)
                models[weight_seed] = build_model(module, "Model", weight_seed, device, init_inputs)
                phases.lap("model")
            with phases.on_device(lock, "trials"):
                inputs, args, output, case_recorder, distribution = _run_case(models[weight_seed], inputs, case, device)
                if case == 0:
                    recorder = case_recorder
                work_per_case.append(case_recorder.work())
                copying.append(sorted(case_recorder.copying_ops))
                distributions.append(distribution)
                noise.append(rounding_noise(models[weight_seed], args, output, spec))
                digest = _digest(args, output, spec["input_seed"])
                first = seen_per_seed.setdefault(weight_seed, digest)
                if first is not digest and first.inputs != digest.inputs:
                    same_output[case] = first.output == digest.output
                del args
            expected = tensors.to_cpu(output)  # after the hold: CPU work a waiting timing need not drain behind
            del output
            case_files = tensors.nbytes((init_inputs, inputs, expected))
            if not _room_for(exchange, case_files, spec):  # the case's files are written only once they fit
                if case < min(2, n_cases):
                    return _no_room(exchange, case_files, spec)
                noise.pop()
                work_per_case.pop()
                copying.pop()
                distributions.pop()
                n_cases = case  # the cases so far are enough
                break
            tensors.save(exchange / f"init_{case}.pt", init_inputs)
            tensors.save(exchange / f"inputs_{case}.pt", inputs)
            tensors.save(workdir / f"expected_{case}.pt", expected)
            outputs_meta.append(_describe(expected))
            if case == 0:
                input_bytes = tensors.nbytes(inputs)
            output_bytes = max(output_bytes, tensors.nbytes(expected))
            case_bytes = tensors.nbytes((inputs, expected))
            files_bytes += case_bytes + tensors.nbytes(init_inputs)
            phases.lap("outputs")
            if case == 0:
                n_cases = cases_within(spec["trials"], case_bytes, spec.get("exchange_max_bytes"))
            case += 1
    compared = [same for kept, same in same_output.items() if kept < n_cases]
    if all(compared):  # nothing told the output apart yet (or no two cases share a weight seed): a native draw
        compared.append(_same_on_a_native_draw(module, models, seen_per_seed, spec, phases))
    result: ReferenceResult = {
        "status": "ok",
        "cases": n_cases,
        "output_bytes": output_bytes,
        "files_bytes": files_bytes,
        "rounding_noise": noise,
        "weight_seeds": spec["weight_seeds"],
        "compute_ops": recorder.compute_ops(),
        "copying_per_case": copying,
        "work_per_case": work_per_case,
        "distributions": distributions,
        "input_bytes": input_bytes,
        "outputs": outputs_meta,
        "phases": phases.seconds,
        "input_independent": all(compared),
    }
    if spec.get("time") and device == "cuda":
        result.update(_time_reference(models[spec["weight_seeds"][0]], exchange, n_cases, spec, phases))
    if device == "cuda":
        result["device_peak_bytes"] = torch.cuda.max_memory_reserved()
    return result


# Per case: how its floating inputs are drawn, each redrawn one scaled to the root mean square of what
# get_inputs() drew (its scale, whatever its distribution): signed normal values, get_inputs()' own, then
# four times wider with a thousandth of them ten times larger again. Where an op of the reference acts
# as a copy on a case (a ReLU of [0, 1) inputs; of signed values not), ``copying_per_case`` names it: a
# knockout picked there poisons copies too.
CASE_DISTRIBUTIONS = ("signed", "native", "wide_with_outliers")
OUTLIER_SHARE, OUTLIER_SCALE, WIDE_SCALE = 1e-3, 10.0, 4.0


class Digest(NamedTuple):
    inputs: list[tuple[int, torch.Size]]
    output: list[tuple[int, torch.Size]]


def _digest(args: list[Any], output: Any, key: int) -> Digest:
    """A case's inputs and output, bit for bit: two cases of one weight seed whose inputs differ and
    outputs do not show a reference whose answer does not depend on its inputs."""

    def of(obj: Any) -> list[tuple[int, torch.Size]]:
        return [(tensors.fingerprint(t, key)[0], t.shape) for t in tensors.tensors_in(obj)]

    return Digest(of(args), of(output))


def _same_on_a_native_draw(
    module: Any, models: dict[int, torch.nn.Module], seen_per_seed: dict[int, Digest], spec: ReferenceSpec, phases: Phases
) -> bool:
    """Whether case 0's model gives case 0's output on a fresh draw of get_inputs()' own (under a seed
    no case used): the probe that tells a reference constant only on the hidden distributions (a
    ReLU's row minimum is 0 on signed values) from one constant on every input, whatever the cases."""
    weight_seed = spec["weight_seeds"][0]
    first = seen_per_seed[weight_seed]
    inputs = _make_inputs(module, spec["input_seed"] + spec["trials"], spec["device"], phases, spec.get("gpu_lock"))
    try:
        with torch.no_grad(), phases.on_device(spec.get("gpu_lock"), "trials"):
            args = tensors.to_device(inputs, spec["device"])
            output = models[weight_seed](*args)
            probe = _digest(args, output, spec["input_seed"])
            del args, output
    except Exception:  # out of memory, say: the cases judge as they are
        return False
    return probe.inputs != first.inputs and probe.output == first.output


def _run_case(model: torch.nn.Module, inputs: list[Any], case: int, device: str) -> tuple[list[Any], Any, Any, OpRecorder, str]:
    """The case's inputs, their device copy, the output and the op record: on the case's hidden
    distribution where the reference gives a finite output on it, else on get_inputs()'s own."""
    distribution = CASE_DISTRIBUTIONS[case % len(CASE_DISTRIBUTIONS)]
    if distribution != "native":
        hidden = tensors.map_tensors(inputs, functools.partial(_redraw, distribution=distribution))
        try:
            args = tensors.to_device(hidden, device)
            recorder = OpRecorder(watch_copies=True)
            with recorder:
                output = model(*args)
            if all(bool(torch.isfinite(t).all()) for t in tensors.tensors_in(output) if t.is_floating_point() or t.is_complex()):
                return hidden, args, output, recorder, distribution
        except torch.OutOfMemoryError:
            raise
        except Exception:  # inputs the module cannot take: a Cholesky of what is no longer positive-definite
            pass
        del hidden
    args = tensors.to_device(inputs, device)
    recorder = OpRecorder(watch_copies=True)
    with recorder:
        output = model(*args)
    return inputs, args, output, recorder, "native"


def _redraw(t: torch.Tensor, *, distribution: str) -> torch.Tensor:
    if not t.is_floating_point() or t.numel() == 0:
        return t
    scale = float(t.detach().float().pow(2).mean().sqrt()) or 1.0
    if distribution == "signed":
        return (torch.randn_like(t, dtype=torch.float32) * scale).to(t.dtype)
    wide = torch.randn_like(t, dtype=torch.float32) * (WIDE_SCALE * scale)
    outliers = torch.rand_like(wide) < OUTLIER_SHARE
    return torch.where(outliers, wide * OUTLIER_SCALE, wide).to(t.dtype)


ROTATION_MAX = 3  # value sets the timed calls cycle through
ROTATION_BYTES = 1 << 30  # inputs larger than this cycle through two sets only (each set is a device copy)


def timing_rotation(exchange: Path, cases: int) -> list[int]:
    """The cases whose inputs the timed calls take in turn, the same for the reference and the
    candidate: those shaped like case 0's (at most ``ROTATION_MAX``, two for large inputs)."""
    shapes = [[tuple(t.shape) for t in tensors.tensors_in(tensors.load(exchange / f"inputs_{case}.pt"))] for case in range(cases)]
    rotation = [case for case in range(cases) if shapes[case] == shapes[0]]
    nbytes = os.path.getsize(exchange / "inputs_0.pt")
    return rotation[: 2 if nbytes > ROTATION_BYTES else ROTATION_MAX]


NOISE_NUDGES = 4  # one nudge's noise is a random draw: a few, and their largest, keep a correct kernel clear of its tail


def rounding_noise(model: torch.nn.Module, args: list[Any], output: Any, spec: ReferenceSpec) -> list[float] | None:
    """Per output tensor, how far the reference's own output moves when its inputs move by one
    rounding step (the largest of a few random nudges): the noise floor of an output whose variation
    is mostly rounding (a mean of normalised values is 0 up to rounding). Measured only where the
    judge would hold a correct candidate to the output's variation (it looks constant at the
    tolerance); else None."""
    from reward_svc.verify import Tolerance, looks_constant

    tolerance = Tolerance(spec.get("atol"), spec.get("rtol"))
    outs = tensors.tensors_in(output)
    if not any(t.is_floating_point() and looks_constant(t, *tolerance.for_dtype(t.dtype)) for t in outs):
        return None

    def nudge(t: torch.Tensor) -> torch.Tensor:
        if not t.is_floating_point():
            return t
        return t * (1 + torch.finfo(t.dtype).eps * (2 * torch.rand_like(t) - 1))

    compute = [torch.promote_types(t.dtype, torch.float32) for t in outs]
    norms = [0.0] * len(outs)
    for _ in range(NOISE_NUDGES):
        moved = tensors.tensors_in(model(*tensors.map_tensors(args, nudge)))
        for i, (a, b, c) in enumerate(zip(outs, moved, compute)):
            if a.is_floating_point() and a.shape == b.shape:
                n = float((a.to(c) - b.to(c)).norm())
                norms[i] = max(norms[i], n if math.isfinite(n) else 0.0)  # no noise floor where it cannot be measured
        del moved
    return norms


def _room_for(scratch: Path, nbytes: int, spec: ReferenceSpec) -> bool:
    """Whether ``nbytes`` more leave the scratch filesystem its free minimum: groups admitted
    together can each fit the exchange budget and still not fit the filesystem together."""
    return shutil.disk_usage(scratch).free - nbytes >= spec.get("scratch_min_free_bytes", 0)


def _no_room(scratch: Path, nbytes: int, spec: ReferenceSpec) -> ReferenceResult:
    free = shutil.disk_usage(scratch).free
    return {
        "status": "no_room",
        "reason": f"no room for the trial tensors in the scratch dir: {nbytes / 1e9:.2f} GB more would leave "
        f"{(free - nbytes) / 1e9:.2f} GB free, below the {spec.get('scratch_min_free_bytes', 0) / 1e9:.2f} GB kept "
        "(KZ_REWARD_SCRATCH_MIN_FREE_BYTES; a larger KZ_REWARD_SCRATCH_DIR or fewer groups at once)",
    }


def cases_within(trials: int, case_bytes: int, budget: int | None) -> int:
    """Correctness cases whose files fit the exchange budget, but at least two where two were asked:
    a cache across calls shows only when the same tensors come back with other values."""
    if not budget or case_bytes <= 0:
        return trials
    return max(min(2, trials), min(trials, budget // case_bytes))


def _make_inputs(module: Any, seed: int, device: str, phases: Phases, lock: DeviceLockDescriptors | None) -> list[Any]:
    """``get_inputs()`` under the secret seed. On a GPU its tensors are drawn there (a GB of random
    numbers is milliseconds on the device, seconds on the host); a module whose inputs cannot be
    made on the device (a host-only detour) gets them on the host."""
    if device == "cuda":
        with phases.on_device(lock, "inputs"), torch.device("cuda"):
            torch.random.manual_seed(seed)
            try:
                return list(module.get_inputs())
            except Exception as exc:  # the host path below reports the module's own errors
                print(f"kz: inputs made on the host: get_inputs() failed on the device: {exc!r}", file=sys.stderr)
    torch.random.manual_seed(seed)
    return list(module.get_inputs())


def _time_reference(model: torch.nn.Module, exchange: Path, cases: int, spec: ReferenceSpec, phases: Phases) -> ReferenceResult:
    """Timed on the same rotation of input values as the candidate's timed calls (timing_rotation)."""
    from services.children.timing import time_gpu

    lock, budget_s = spec.get("gpu_lock"), spec.get("timing_budget_s", 10.0)
    timings: ReferenceResult = {}
    with torch.no_grad():
        compiled = None
        # The copies to the device before any hold (as the candidate's); compiling (seconds) holds the
        # lock shared; only timing holds it exclusive.
        sets = [tensors.load(exchange / f"inputs_{case}.pt", "cuda") for case in timing_rotation(exchange, cases)]
        phases.lap("inputs")
        with phases.on_device(lock, "timing_setup"):
            inputs = tensors.clone(sets[0])
            if spec.get("time_compiled"):
                compiled = torch.compile(model)
                compiled(*inputs)
        targets = tensors.tensors_in(inputs)

        def prepare(call: int) -> None:
            for target, value in zip(targets, tensors.tensors_in(sets[call % len(sets)])):
                target.copy_(value)

        with phases.on_device(lock, "timing", exclusive=True):
            timings["timing"] = time_gpu(lambda: model(*inputs), budget_s=budget_s, prepare=prepare)
            if compiled is not None:
                timings["timing_compiled"] = time_gpu(lambda: compiled(*inputs), budget_s=budget_s, prepare=prepare)
    return timings


def _describe(output: Any) -> OutputDescription:
    ts = tensors.tensors_in(output)
    return {"tensors": len(ts), "shapes": [list(t.shape) for t in ts], "dtypes": [str(t.dtype) for t in ts]}
