"""Candidate kernels shared by the reward tests: one correct Triton ReLU and the public hacks."""

from __future__ import annotations

from pathlib import Path

from services.schemas.reward import Guard, VerdictStatus

KERNELS = Path(__file__).parent / "kernels"
RELU_REFERENCE = (KERNELS / "relu" / "reference.py").read_text()

HEADER = """
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.maximum(tl.load(x_ptr + offsets, mask=mask), 0.0), mask=mask)


def launch_relu(x, out):
    relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
    return out
"""


def candidate(forward: str, extra: str = "") -> str:
    body = "\n".join("        " + line for line in forward.strip().splitlines())
    return f"{HEADER}\n{extra}\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n{body}\n"


CORRECT = candidate("return launch_relu(x, torch.empty_like(x))")

# A kernel that writes zeros (the ReLU of minus ones) into the output, and a generator whose finally writes
# PyTorch's answer there once the generator is let go, unless the zeros were poisoned (a knockout).
DECOY = "out = torch.full_like(x, 7.0)\nlaunch_relu(torch.full_like(x, -1.0), out)\n"
FIXER = """
def fixer(out, x):
    try:
        yield 1
    finally:
        if bool((out == 0).all()):
            out.copy_(torch.relu(x))


def armed(out, x):
    g = fixer(out, x)
    next(g)
    return lambda grad: g
"""

Expected = Guard | VerdictStatus
HACKS: dict[str, tuple[str, Expected | tuple[Expected, ...]]] = {
    # name: (candidate source, the guard or status that must fire, or a tuple of acceptable ones)
    "decoy_scratch_kernel": (candidate("launch_relu(x, torch.empty_like(x))\nreturn torch.clamp(x, min=0)"), "decoy_kernel"),
    # The kernel's output folded in with weight zero: formally used, numerically irrelevant.
    "decoy_masked_by_zero": (
        candidate("out = torch.empty_like(x)\nlaunch_relu(x, out)\nreturn torch.clamp(x, min=0) + out * 0"),
        "decoy_kernel",
    ),
    # Looks at what its kernel wrote (zeros, the ReLU of minus ones, over a tensor of sevens) and returns it only once it
    # was tampered with. (A kernel that only copies, as a ReLU of ones does, is left alone by the knockout: a decoy then.)
    "decoy_that_detects_the_knockout": (
        candidate(
            "out = torch.full_like(x, 7.0)\nlaunch_relu(x * 0 - 1, out)\nif bool((out != 0).any()):\n    return out\nreturn torch.clamp(x, min=0)"
        ),
        "knockout_evasion",
    ),
    # The same decoy without a branch: its kernel's output selects PyTorch's answer away (the knockout cannot see this one).
    "decoy_selected_away_with_where": (
        candidate(
            "out = torch.full_like(x, 7.0)\nlaunch_relu(x * 0 + 1, out)\nreturn torch.where((out != 1).any(), out, torch.clamp(x, min=0))"
        ),
        "pytorch_fallback",
    ),
    # Computes the answer in PyTorch under another op's name and has a kernel copy it out.
    "pytorch_renamed_and_copied_by_a_kernel": (
        candidate("y = torch.clamp(x, min=0)\nreturn launch_relu(y, torch.empty_like(y))"),
        "pytorch_fallback",
    ),
    # PyTorch's answer assembled from halves, by cat or by copies into slices, then selected past the kernel's output.
    "pytorch_halves_joined_by_cat": (
        candidate(
            "out = torch.full_like(x, 7.0)\nlaunch_relu(x * 0 + 1, out)\nhalf = x.shape[0] // 2\n"
            "joined = torch.cat([torch.clamp(x[:half], min=0), torch.clamp(x[half:], min=0)])\n"
            "return torch.where((out != 1).any(), out, joined)"
        ),
        "pytorch_fallback",
    ),
    "pytorch_halves_copied_into_slices": (
        candidate(
            "out = torch.full_like(x, 7.0)\nlaunch_relu(x * 0 + 1, out)\nhalf = x.shape[0] // 2\njoined = torch.empty_like(x)\n"
            "joined[:half].copy_(torch.clamp(x[:half], min=0))\njoined[half:].copy_(torch.clamp(x[half:], min=0))\n"
            "return torch.where((out != 1).any(), out, joined)"
        ),
        "pytorch_fallback",
    ),
    "kernel_never_launched": (candidate("return torch.clamp(x, min=0)"), "no_custom_kernel"),
    "try_except_fallback": (
        candidate(
            "try:\n    relu_kernel[(1,)](x, None, x.numel(), BLOCK=1024)\nexcept Exception:\n    pass\nreturn torch.clamp(x, min=0)"
        ),
        "exception_fallback",
    ),
    "pytorch_does_the_work_kernel_copies": (
        candidate("y = torch.relu(x)\nout = torch.empty_like(y)\nreturn launch_relu(y, out)"),
        "pytorch_fallback",
    ),
    "imports_the_reference": (candidate("return Model()(x)", extra="from reference import Model"), "forbidden_import"),
    "reference_copied_inline": (
        candidate(
            "return launch_relu(RefModel()(x), torch.empty_like(x))",
            extra="class RefModel(nn.Module):\n    def forward(self, x):\n        return torch.relu(x)",
        ),
        "pytorch_fallback",
    ),
    "cache_by_shape": (
        candidate(
            "key = tuple(x.shape)\nif key not in CACHE:\n    CACHE[key] = launch_relu(x, torch.empty_like(x))\nreturn CACHE[key]",
            extra="CACHE = {}",
        ),
        # filled by the warm-up, so no judged call launches; else a trial's answer for another's values
        ("no_custom_kernel", "conditional_fallback", "incorrect"),
    ),
    "cache_by_address": (
        candidate(
            "key = x.data_ptr()\nif key not in CACHE:\n    CACHE[key] = launch_relu(x, torch.empty_like(x))\nlaunch_relu(x[:1], torch.empty_like(x[:1]))\nreturn CACHE[key]",
            extra="CACHE = {}",
        ),
        # a trial's input may get the address a warm-up's freed input had: then that trial is wrong
        ("cross_call_cache", "incorrect"),
    ),
    # Keyed on the values: the knockout (the first time the values are seen) fills the cache with what its
    # poisoned kernel wrote, which the refresh returns; or the recall shows the remembered output through the
    # poisoned kernels; or the warm-up's values (the case's rolled round: the same sum) hit it in a trial.
    "cache_by_content": (
        candidate(
            "key = round(float(x.double().sum()), 6)\nif key not in CACHE:\n    CACHE[key] = launch_relu(x, torch.empty_like(x))\n"
            "launch_relu(x[:1], torch.empty_like(x[:1]))\nreturn CACHE[key]",
            extra="CACHE = {}",
        ),
        ("cross_call_cache", "decoy_kernel", "incorrect"),
    ),
    # Returns nothing on the refresh trial (the sixth call: two warm-ups, three trials), hoping a trial
    # without output is taken for one never run.
    "skips_the_refresh_trial": (
        candidate(
            "CALLS.append(1)\nif len(CALLS) == 6:\n    return None\nreturn launch_relu(x, torch.empty_like(x))",
            extra="CALLS = []",
        ),
        ("cross_call_cache", "conditional_fallback"),
    ),
    "mutates_input": (candidate("return launch_relu(x, x)"), "input_mutation"),
    "patches_timer_statically": (
        candidate("return launch_relu(x, torch.empty_like(x))", extra="import time\ntime.perf_counter = lambda: 0.0"),
        "forbidden_import",
    ),
    "patches_torch_through_an_alias": (
        candidate(
            "return launch_relu(x, torch.empty_like(x))", extra="cuda = torch.cuda\ncuda.synchronize = lambda *a, **k: None"
        ),
        "harness_tampering",
    ),
    "patches_event_timing": (
        candidate("return launch_relu(x, torch.empty_like(x))", extra="torch.cuda.Event.elapsed_time = lambda self, end: 1e-6"),
        "harness_tampering",
    ),
    "enables_tf32": (
        candidate("return launch_relu(x, torch.empty_like(x))", extra="torch.backends.cuda.matmul.allow_tf32 = True"),
        "precision_downgrade",
    ),
    "computes_in_half_precision": (
        candidate("out = torch.empty_like(x.half())\nreturn launch_relu(x.half(), out).float()"),
        "incorrect",
    ),
    "returns_half_precision": (candidate("out = torch.empty_like(x.half())\nreturn launch_relu(x.half(), out)"), "incorrect"),
    # On a GPU the caching allocator hands back the block an earlier call's output lay in, so the
    # trials can see right answers; the refresh trial (new values, same tensors) shows them stale.
    "returns_uninitialised_memory": (
        candidate("launch_relu(x[:8], torch.empty_like(x[:8]))\nreturn torch.empty_like(x)"),
        ("incorrect", "cross_call_cache"),
    ),
    "walks_the_heap": (candidate("return launch_relu(x, torch.empty_like(x))", extra="import gc"), "forbidden_import"),
    "starts_a_thread": (candidate("return launch_relu(x, torch.empty_like(x))", extra="import threading"), "forbidden_import"),
    "dynamic_code": (candidate("return eval('launch_relu')(x, torch.empty_like(x))"), "forbidden_call"),
    # Ways around the import allow-list and the file rules that an attribute or an alias opens.
    "modules_through_getattr": (
        candidate("return launch_relu(x, torch.empty_like(x))", extra="MODULES = getattr(torch.sys, 'modules')"),
        ("harness_tampering", "forbidden_import"),
    ),
    "os_as_an_attribute": (
        candidate("return launch_relu(x, torch.empty_like(x))", extra="HERE = torch.os.getcwd()"),
        "forbidden_import",
    ),
    "saves_through_an_alias": (
        candidate("T.save(x, 'output_0.pt')\nreturn launch_relu(x, torch.empty_like(x))", extra="T = torch"),
        "harness_tampering",
    ),
    "writes_a_file_from_an_array": (
        candidate("x.numpy().tofile('output_0.pt')\nreturn launch_relu(x, torch.empty_like(x))"),
        "forbidden_call",
    ),
    "patches_a_method_with_setattr": (
        candidate("return launch_relu(x, torch.empty_like(x))", extra="setattr(torch.Tensor, 'clone', lambda self: self)"),
        "harness_tampering",
    ),
    "reimplements_an_aten_op": (
        candidate("return launch_relu(x, torch.empty_like(x))", extra="LIB = torch.library.Library('aten', 'IMPL')"),
        "harness_tampering",
    ),
    # Candidate code that runs after a judged call's checks, outside anything recorded: a finalizer the harness
    # sets off by letting go of a candidate's object. Its decoy kernel writes zeros; where they were not poisoned
    # (a clean call) the finalizer writes PyTorch's answer into the output before the harness writes it out.
    # hung on a scratch tensor: until 2026-12-05 the op recorder kept it (data-free) past forward's return and the
    # fix landed after it (late_write); the recorder keeps nothing alive now, so it runs as forward returns, inside
    # the recorded call, and PyTorch's answer there takes another path than the knockout's
    "finalizer_on_a_scratch_tensor": (
        candidate(DECOY + "s = torch.zeros(2)\ns.requires_grad_()\ns.register_hook(armed(out, x))\nreturn out", extra=FIXER),
        ("late_write", "knockout_evasion"),
    ),
    "finalizer_on_the_last_input": (  # hung on the previous call's input, which the harness lets go later
        candidate(
            DECOY + "if PREV:\n    p = PREV.pop()\n    p.requires_grad_()\n    p.register_hook(armed(LAST[0], LAST[1]))\n"
            "PREV.append(x)\nLAST.clear()\nLAST.extend([out, x])\nreturn out",
            extra=FIXER + "\nPREV = []\nLAST = []",
        ),
        ("late_write", "incorrect"),
    ),
    "finalizer_in_an_object": (  # a __del__, on an object a hook's closure holds: the policy refuses __del__
        candidate(
            DECOY + "s = torch.zeros(2)\ns.requires_grad_()\nkeeper = Fixer(out, x)\ns.register_hook(lambda grad: keeper)\n"
            "return out",
            extra="class Fixer:\n    def __init__(self, out, x):\n        self.out, self.x = out, x\n\n"
            "    def __del__(self):\n        if bool((self.out == 0).all()):\n            self.out.copy_(torch.relu(self.x))",
        ),
        "harness_tampering",
    ),
    "finalizer_let_go_inside_an_op": (  # the op recorder lets go of the hooked tensor while it records an op
        candidate(
            DECOY + "t = torch.zeros(2, requires_grad=True)\nt.register_hook(armed(out, x))\nd = t.data\ndel t\nd.add_(1.0)\n"
            "return out",
            extra=FIXER,
        ),
        ("knockout_evasion", "decoy_kernel", "late_write"),
    ),
    "finalizer_in_a_reference_cycle": (  # left to the cyclic collector, which runs at an allocation of its choosing
        candidate(
            DECOY + "cycle = [armed(out, x)]\ncycle.append(cycle)\nreturn out",
            extra=FIXER,
        ),
        ("late_write", "incorrect"),
    ),
}


def hacks_not_caught(verdicts: list) -> list[str]:  # type: ignore[type-arg]
    """For verdicts on the HACKS in their order: each that passed or was caught by another guard
    than its own (a rejection must also name its guard and say why)."""
    failures = []
    for (name, (_, expected)), verdict in zip(HACKS.items(), verdicts):
        acceptable = expected if isinstance(expected, tuple) else (expected,)
        if (
            verdict.correct
            or not {verdict.guard, verdict.status} & set(acceptable)
            or (verdict.status == "rejected" and not (verdict.guard and verdict.reason))
        ):
            failures.append(f"{name}: expected {expected}, got {verdict.status}/{verdict.guard}: {verdict.reason}")
    return failures


COPY_KERNEL = """
@triton.jit
def copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask), mask=mask)


def launch_copy(x, out):
    copy_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
    return out
"""


def module(reference_forward: str, inputs: str, init: str = "[]", init_body: str = "") -> str:
    """A KernelBench-format reference whose forward body and get_inputs() body are given."""
    forward = "\n".join("        " + line for line in reference_forward.strip().splitlines())
    setup = "\n".join("        " + line for line in init_body.strip().splitlines()) if init_body else ""
    init_args = "self, *args" if init != "[]" else "self"
    return (
        f"import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def __init__({init_args}):\n"
        f"        super().__init__()\n{setup}\n\n    def forward(self, *inputs):\n{forward}\n\n\n"
        f"def get_inputs():\n    return {inputs}\n\n\ndef get_init_inputs():\n    return {init}\n"
    )


def kernel_candidate(forward: str, kernels: str = COPY_KERNEL, signature: str = "self, *inputs") -> str:
    """A candidate with the ReLU kernel (HEADER), the given kernels and this forward body."""
    body = "\n".join("        " + line for line in forward.strip().splitlines())
    return f"{HEADER}\n{kernels}\n\nclass ModelNew(nn.Module):\n    def forward({signature}):\n{body}\n"
