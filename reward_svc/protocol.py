"""The worker ↔ harness protocol: the job each evaluation child gets on stdin and the result it signs.

One definition both sides import (``evaluate.py`` writes the specs and reads the results, the
harness in ``harness/`` reads the specs and writes the results, ``verify.py`` judges from them), so a
key misspelt on either side is a type error. The results are data from a process that ran untrusted
code, signed or not: the worker holds them to these types before anything reads them (``candidate_result``,
``reference_result``), and the judge checks what it relies on beyond their types (``verify.judge``).
"""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING, Any, Literal, NotRequired, TypeVar

from pydantic import TypeAdapter, ValidationError
from typing_extensions import TypedDict  # pydantic validates typing's own TypedDict only from Python 3.12

from services.children.device import DeviceLockDescriptors

if TYPE_CHECKING:  # both modules import torch, which the services and the CLI load only where they judge
    from services.children.ops import Work
    from services.children.timing import Timing

# The candidate's knockout trials, by output name: "knockout" runs a case the first time forward sees its
# values (which case is the worker's secret), "recall" runs it once more after its clean run (the refresh),
# so an answer remembered from an earlier call shows through.
KNOCKOUTS = ("knockout", "recall")
# A child's result as JSON, at most (``candidate_result``): an honest one is a few KiB, past a MiB only where the
# reference returns thousands of tensors (the candidate's fingerprints: about 20 bytes a tensor, per output file).
RESULT_MAX_BYTES = 4 << 20
REFUSAL_MAX_CHARS = 300


class _JobSpec(TypedDict):
    device: str
    weight_seeds: list[int]  # two: a candidate that ignores the weights it was given cannot pass
    trials: int
    time: bool  # time it on the GPU
    timing_budget_s: float
    gpu_lock: NotRequired[DeviceLockDescriptors | None]  # the pool adds it: the descriptors the child holds
    exchange_fd: NotRequired[int | None]  # the pool adds it: a GPU child's end of its device exchange socket


class ReferenceSpec(_JobSpec):
    role: Literal["reference"]
    reference_path: str
    input_seed: int
    time_compiled: bool
    exchange_max_bytes: int
    atol: float | None
    rtol: float | None
    scratch_min_free_bytes: int


class CandidateSpec(_JobSpec):
    role: Literal["candidate"]
    candidate_path: str
    backend: Literal["cuda", "triton"]
    exchange_dir: str  # its inbox: the group's inputs, read-only
    compile_cache: str  # its build dir, or its source's published build (read-only)
    compile_cache_readonly: bool
    fingerprint_key: int  # the judge's check that each output file is what its trial returned
    outputs_in_flight: int
    # the case run as the knockout the first time its values are seen (the worker's secret pick among all),
    # then clean (the refresh) and knocked out again (the recall)
    knockout_case: int
    copies_are_work: bool  # the reference has an op that acts as a copy on that case: the knockout poisons copies too
    # outputs on the device of at least this many bytes go to the judge through the exchange socket, not files
    device_exchange_min_bytes: NotRequired[int]


class ReferenceResult(TypedDict, total=False):
    status: Literal["ok", "invalid_reference", "out_of_memory", "no_room", "runtime_error"]
    reason: str
    cases: int  # correctness cases written (fewer than asked where their files would pass the exchange budget)
    output_bytes: int
    input_bytes: int
    files_bytes: int
    rounding_noise: list[list[float] | None]  # per case: the judge holds each trial to its own case's noise
    weight_seeds: list[int]
    compute_ops: dict[str, dict[str, int]]
    copying_per_case: list[list[str]]  # per case: its ops that acted as a copy on its values
    work_per_case: list[Work]
    distributions: list[str]  # per case: the hidden distribution its inputs were drawn from
    # other inputs gave the same output, bit for bit: every case that shares a weight seed with an earlier
    # one, and a fresh draw of get_inputs()' own against case 0: the task cannot tell a kernel that
    # computes its answer from one that remembers it
    input_independent: bool
    outputs: list[OutputDescription]  # per case
    phases: dict[str, float]
    timing: Timing
    timing_compiled: Timing
    memory_retries: int
    device_peak_bytes: int  # the allocator's peak on the GPU: what the group's candidates reserve is sized from it


class OutputDescription(TypedDict):
    """What one case's expected output holds."""

    tensors: int
    shapes: list[list[int]]
    dtypes: list[str]


class Observations(TypedDict, total=False):
    """What the candidate's harness recorded (``harness/candidate.py``), for the judge's dynamic guards."""

    launches_per_case: list[int]
    work_per_case: list[Work]
    compute_ops: dict[str, dict[str, int]]
    launches: dict[str, int]
    failed_launches: dict[str, int]
    forged_launches: list[str]
    native_policy: list[str]
    replaced_functions: list[str]
    precision_changes: list[str]
    pytorch_output: str | None
    pytorch_output_kind: str | None
    knockouts: dict[str, KnockoutObservations]  # by trial: "knockout" (values never seen), "recall" (seen)
    kernel_share: float


class KnockoutObservations(TypedDict, total=False):
    """What one knockout trial recorded (``harness/candidate.py``)."""

    copies: int  # launches that only copied, left alone
    path: str | None  # where its path of ops and launches left the refresh trial's on the same values
    raised: str  # forward raised on its kernels' poisoned results
    refused: str  # a PyTorch op refused the poisoned values and no stand-in could be made
    stood_in: list[str]  # ops that refused the knockout's values and returned wrong ones instead


class CandidateResult(TypedDict, total=False):
    status: Literal["ok", "rejected", "runtime_error", "compile_error", "unverified", "timeout"]
    guard: str  # one of services.schemas.reward.Guard: checked by the judge, never trusted
    reason: str
    traceback: str
    out_of_memory: bool
    observations: Observations
    phases: dict[str, float]
    trial_holds: dict[str, float]  # its ``trials`` phase by what ran in the holds (``HoldSplit``): diagnostics only
    builds: list[dict[str, str | float | bool]]  # its load_inline builds (``compile.CompileEntry``'s fields): diagnostics only
    output_fingerprints: dict[str, list[int]]
    timing: Timing
    device_peak_bytes: int  # reported beside the worker's estimate (reward_svc/admission.py); never trusted
    device_exchange_fallback: str  # why outputs went as files with the device exchange on: diagnostics only


class RefusedResult(ValueError):
    """A child's result that is not what its contract says, though signed: native code in the child can sign
    anything. The message says what is wrong, in a line."""


_Contract = TypeVar("_Contract", CandidateResult, ReferenceResult)


def candidate_result(answer: dict[str, Any]) -> CandidateResult:
    """A candidate child's result as ``CandidateResult`` has it, or ``RefusedResult``."""
    return _checked(_adapters()[0], answer)


def reference_result(answer: dict[str, Any], trials: int) -> ReferenceResult:
    """A reference child's result as ``ReferenceResult`` has it, with 1 to ``trials`` cases where it is ok (every
    candidate's trials, knockout pick and files follow from them), or ``RefusedResult``. A reference is untrusted
    code too: a proposed module, or any caller's."""
    result = _checked(_adapters()[1], answer)
    cases = result.get("cases")
    if result.get("status") == "ok" and not (cases is not None and 0 < cases <= trials):
        raise RefusedResult(f"cases: {cases} where 1 to {trials} were asked")
    return result


def _checked(adapter: TypeAdapter[_Contract], answer: dict[str, Any]) -> _Contract:
    """Strictly: each value of its field's type (no "3" for 3), no key the contract does not name (where a forged
    nesting could hide), and at most ``RESULT_MAX_BYTES`` as JSON. No field is typed Any, so what passes is as
    deep as the contract and no deeper."""
    try:
        checked = adapter.validate_python(answer, strict=True, extra="forbid")
    except ValidationError as exc:
        raise RefusedResult(_first_error(exc)) from None
    size = len(json.dumps(checked))
    if size > RESULT_MAX_BYTES:
        raise RefusedResult(f"{size} bytes as JSON, at most {RESULT_MAX_BYTES}")
    return checked


def _first_error(exc: ValidationError) -> str:
    """Where and what, of the first error (the input itself left out: it is the child's, of any size)."""
    errors = exc.errors(include_url=False, include_context=False, include_input=False)
    where = ".".join(str(part) for part in errors[0]["loc"]) or "the result"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}: {errors[0]['msg']}{more}"[:REFUSAL_MAX_CHARS]


@functools.cache
def _adapters() -> tuple[TypeAdapter[CandidateResult], TypeAdapter[ReferenceResult]]:
    """Built where a result is first checked: pydantic resolves the names the contracts' annotations use from
    this frame, ``Timing`` and ``Work`` among them (their modules load torch, which a service only loads to judge)."""
    from services.children.ops import Work  # noqa: F401
    from services.children.timing import Timing  # noqa: F401

    return TypeAdapter(CandidateResult), TypeAdapter(ReferenceResult)
