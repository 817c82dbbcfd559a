"""The reward service's verdicts on CPU (Triton interpreter): correct kernels pass, and each
public reward hack is caught by the guard meant for its class, through the real sandbox."""

from __future__ import annotations

from reward_cases import CORRECT, HACKS, HEADER, RELU_REFERENCE, candidate, hacks_not_caught
from reward_svc.evaluate import Evaluator
from services.schemas.reward import ScoreOptions


def test_correct_triton_kernel_passes_and_hacks_are_caught(evaluator: Evaluator) -> None:
    sources = [CORRECT] + [source for source, _ in HACKS.values()]
    evaluation = evaluator.evaluate_group(RELU_REFERENCE, sources, ScoreOptions(backend="triton", device="cpu", timeout_s=120))
    correct, *verdicts = evaluation.verdicts
    assert correct.status == "correct", correct.reason
    assert correct.speedup is None and "not measured" in correct.reason
    failures = hacks_not_caught(verdicts)
    assert not failures, "\n".join(failures)


TINY_REFERENCE = RELU_REFERENCE.replace("return torch.relu(x)", "return torch.relu(x) * 1e-6 + 0.5")


def test_near_constant_output_does_not_pass(evaluator: Evaluator) -> None:
    """allclose alone would accept a constant here: the reference varies far below atol."""
    constant = candidate("out = torch.empty_like(x)\nlaunch_relu(x, out)\nreturn out * 0 + 0.5")
    scaled = candidate("out = torch.empty_like(x)\nlaunch_relu(x, out)\nreturn out * 1e-6 + 0.5")
    constant_verdict, scaled_verdict = evaluator.evaluate_group(
        TINY_REFERENCE, [constant, scaled], ScoreOptions(backend="triton", device="cpu")
    ).verdicts
    assert constant_verdict.status == "incorrect" and "degenerate" in constant_verdict.reason
    assert scaled_verdict.status == "correct", scaled_verdict.reason


LINEAR_REFERENCE = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(features))

    def forward(self, x):
        return torch.relu(x * self.scale)


def get_inputs():
    return [torch.randn(8, 256)]


def get_init_inputs():
    return [256]
"""


def test_weights_must_be_the_ones_given(evaluator: Evaluator) -> None:
    """Trials use two weight seeds: a candidate with its own fixed weights cannot pass."""
    uses_weights = candidate("return launch_relu((x * self.scale).contiguous(), torch.empty_like(x))").replace(
        "class ModelNew(nn.Module):\n",
        "class ModelNew(nn.Module):\n    def __init__(self, features):\n        super().__init__()\n"
        "        self.scale = nn.Parameter(torch.randn(features))\n\n",
    )
    own_weights = uses_weights.replace(
        "self.scale = nn.Parameter(torch.randn(features))", "self.scale = nn.Parameter(torch.ones(features))"
    )
    good, bad = evaluator.evaluate_group(LINEAR_REFERENCE, [uses_weights, own_weights], ScoreOptions(device="cpu")).verdicts
    assert good.status == "correct", good.reason
    assert bad.status == "incorrect"


def test_crash_hang_and_oom_yield_verdicts_and_the_evaluator_keeps_serving(evaluator: Evaluator) -> None:
    hang = candidate("while True:\n    pass")
    oom = candidate("big = torch.empty(1 << 40)\nreturn launch_relu(x, big)")
    wrong_arity = candidate("return launch_relu(x)")
    syntax_error = CORRECT.replace("def forward(self, x):", "def forward(self, x)")
    verdicts = evaluator.evaluate_group(
        RELU_REFERENCE, [hang, oom, wrong_arity, syntax_error], ScoreOptions(device="cpu", timeout_s=15)
    ).verdicts
    assert [v.status for v in verdicts] == ["timeout", "runtime_error", "runtime_error", "compile_error"], [
        v.reason for v in verdicts
    ]
    assert "memory" in verdicts[1].reason.lower()
    # the evaluator's one pool of warm children serves every time limit, each job held to its own
    assert "ran past the 15 s time limit" in verdicts[0].reason, verdicts[0].reason
    after = evaluator.evaluate_group(RELU_REFERENCE, [CORRECT], ScoreOptions(device="cpu")).verdicts[0]
    assert after.status == "correct", after.reason


def test_segfault_in_the_child_is_a_runtime_error(evaluator: Evaluator) -> None:
    # An unmasked store a billion elements past the buffer: the interpreter writes to a wild address.
    wild = HEADER.replace("tl.store(out_ptr + offsets,", "tl.store(out_ptr + offsets + (1 << 40),").replace(
        ", mask=mask), 0.0), mask=mask)", ", mask=mask), 0.0))"
    )
    source = (
        wild + "\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return launch_relu(x, torch.empty_like(x))\n"
    )
    verdict = evaluator.evaluate_group(RELU_REFERENCE, [source], ScoreOptions(device="cpu", timeout_s=60)).verdicts[0]
    assert verdict.status == "runtime_error", verdict.reason


def test_inputs_whose_shape_changes_between_trials_are_not_mistaken_for_a_cache(evaluator: Evaluator) -> None:
    """No refresh trial where the cases' shapes differ (it would compare against the wrong shape)."""
    reference = RELU_REFERENCE.replace("torch.randn(4, 1024)", "torch.randn(int(torch.randint(2, 64, (1,))), 1024)")
    verdict = evaluator.evaluate_group(reference, [CORRECT], ScoreOptions(backend="triton", device="cpu")).verdicts[0]
    assert verdict.status == "correct", verdict.reason


# Mathematically zero for every input: each row minus its mean, summed. What the reference returns
# is its own rounding noise, so a correct kernel that rounds differently must still pass.
ZERO_UP_TO_ROUNDING_REFERENCE = RELU_REFERENCE.replace(
    "return torch.relu(x)", "return (x - x.mean(dim=1, keepdim=True)).sum(dim=1)"
)
CENTRED_SUM_KERNEL = """
@triton.jit
def centred_sum_kernel(x_ptr, out_ptr, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offsets = tl.arange(0, BLOCK)
    mask = offsets < cols
    x = tl.load(x_ptr + row * cols + offsets, mask=mask, other=0.0)
    centred = tl.where(mask, x - tl.sum(x, axis=0) / cols, 0.0)
    tl.store(out_ptr + row, tl.sum(centred, axis=0))
"""


def test_an_output_that_is_rounding_noise_is_judged_against_that_noise(evaluator: Evaluator) -> None:
    centred_sum = candidate(
        "out = torch.empty(x.shape[0], device=x.device)\n"
        "centred_sum_kernel[(x.shape[0],)](x, out, x.shape[1], BLOCK=1024)\nreturn out",
        extra=CENTRED_SUM_KERNEL,
    )
    evaluation = evaluator.evaluate_group(
        ZERO_UP_TO_ROUNDING_REFERENCE, [centred_sum], ScoreOptions(backend="triton", device="cpu")
    )
    assert all(case[0] > 0 for case in evaluation.reference["rounding_noise"])  # measured per case: the output looks constant
    assert evaluation.verdicts[0].status == "correct", evaluation.verdicts[0].reason


ROW_NORM_REFERENCE = RELU_REFERENCE.replace("return torch.relu(x)", "return torch.norm(x, dim=1)")
ROW_SUM_OF_SQUARES = """
@triton.jit
def row_sum_of_squares_kernel(x_ptr, out_ptr, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offsets = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * cols + offsets, mask=offsets < cols, other=0.0)
    tl.store(out_ptr + row, tl.sum(x * x, axis=0))
"""


def test_kernels_the_knockout_once_took_for_decoys_pass(evaluator: Evaluator) -> None:
    """Correct kernels the knockout misjudged: one writing a persistent output buffer (the refresh
    trial had left the same answer in it, so nothing looked written), one whose PyTorch glue
    raised on the poison (a square root of a sum of squares that poison made negative)."""
    persistent_buffer = HEADER + (
        "\n\nclass ModelNew(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.register_buffer('out', torch.empty(4, 1024), persistent=False)\n\n"
        "    def forward(self, x):\n        launch_relu(x, self.out)\n        return self.out\n"
    )
    norm_with_a_check = candidate(
        "sums = torch.empty(x.shape[0], device=x.device)\nrow_sum_of_squares_kernel[(x.shape[0],)](x, sums, x.shape[1], BLOCK=1024)\n"
        "norm = torch.sqrt(sums)\nif torch.isnan(norm).any():\n    raise RuntimeError('NaN in a row norm')\nreturn norm",
        extra=ROW_SUM_OF_SQUARES,
    )
    buffered = evaluator.evaluate_group(
        RELU_REFERENCE, [persistent_buffer], ScoreOptions(backend="triton", device="cpu")
    ).verdicts[0]
    norm = evaluator.evaluate_group(
        ROW_NORM_REFERENCE, [norm_with_a_check], ScoreOptions(backend="triton", device="cpu")
    ).verdicts[0]
    assert buffered.status == "correct", buffered.reason
    assert norm.status == "correct", norm.reason


def test_the_policy_lets_common_kernel_code_through_and_still_refuses_its_routes_around() -> None:
    from reward_svc.policy import check_source

    allowed = {
        "feature test": 'import torch\nFP8 = hasattr(torch, "float8_e4m3fn")',
        "optional function": 'import triton.language as tl\nEXP2 = getattr(tl, "exp2", None)',
        "submodules": "import torch\nclass M(torch.nn.Module):\n    def count(self):\n        return sum(1 for _ in self.modules())",
        "optional import": "try:\n    import triton\nexcept ImportError:\n    triton = None\nHAVE_TRITON = triton is not None",
        "full precision": 'import torch\ntorch.set_float32_matmul_precision("highest")\ntorch.backends.cuda.matmul.allow_tf32 = False',
        "a Triton op": 'import torch\n@torch.library.triton_op("kz::relu", mutates_args=())\ndef relu(x):\n    return x',
        "parameters by name": "import torch\nclass M(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        for i in range(2):\n            setattr(self, f'w{i}', torch.nn.Parameter(torch.ones(1)))",
    }
    refused = {
        "getattr(torch, 'save')": 'import torch\ngetattr(torch, "save")(1, "f.pt")',
        "import torch as T; T._C": "import torch as T\nT._C._set_grad_enabled(False)",
        "medium precision": 'import torch\ntorch.set_float32_matmul_precision("medium")',
        "tf32 on": "import torch\ntorch.backends.cuda.matmul.allow_tf32 = True",
        "an aten override": 'import torch\nLIB = torch.library.Library("aten", "IMPL")',
        "setattr on a class": "import torch\nsetattr(torch.Tensor, 'clone', None)",
    }
    assert {name: [v.describe() for v in check_source(src)] for name, src in allowed.items() if check_source(src)} == {}
    assert [name for name, src in refused.items() if not check_source(src)] == []
