"""The kernel prompt, and extract_code on the replies models actually write: reasoning first,
several blocks, odd fences, no fences, cut-off replies. Each extraction case names what must (or
must not) be in the extracted program. The prompt's worked Triton example passes the reward service."""

from __future__ import annotations

import ast

import pytest

from coder_svc.prompts import EXAMPLE_MODEL, EXAMPLES, SYSTEM_PROMPTS, kernel_messages, system_prompt_for
from reward_svc.evaluate import Evaluator
from services.config import Settings
from services.llm.extract import extract_code
from services.schemas.reward import ScoreOptions

KERNEL = """import torch
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)
"""
MODEL_NEW = """import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        out = torch.empty_like(x)
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
        return out
"""
PROGRAM = KERNEL + "\n\n" + MODEL_NEW
REFERENCE = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)
"""

CUDA_SNIPPET = "__global__ void k() {}\n"
DECOY = "class ModelNew:\n    pass\n"


def fenced(code: str, fence: str = "```", info: str = "python") -> str:
    return f"{fence}{info}\n{code}{fence}\n"


CASES: list[tuple[str, str, list[str], list[str]]] = [
    # (case, reply, must contain, must not contain)
    ("python fence", f"Here it is:\n\n{fenced(PROGRAM)}\nThis fuses nothing.", ["class ModelNew", "relu_kernel"], ["Here it is"]),
    ("py fence", fenced(PROGRAM, info="py"), ["class ModelNew"], []),
    ("bare fence", fenced(PROGRAM, info=""), ["class ModelNew"], []),
    ("tilde fence", fenced(PROGRAM, fence="~~~"), ["class ModelNew"], []),
    (
        "four backticks hold a triple-backtick string",
        fenced(PROGRAM + 'DOC = """\n```\nnot a fence end\n```\n"""\n', fence="````"),
        ["not a fence end", "class ModelNew"],
        [],
    ),
    (
        "reasoning in think tags with a decoy block",
        f"<think>Maybe:\n{fenced(DECOY)}no, use a kernel.</think>\nFinal:\n{fenced(PROGRAM)}",
        ["relu_kernel["],
        ["    pass"],
    ),
    ("only the closing think tag (template opened it)", f"I should fuse.\n</think>\n\n{fenced(PROGRAM)}", ["class ModelNew"], []),
    (
        "reference first, then the answer",
        f"The original:\n{fenced(REFERENCE)}\nOptimized:\n{fenced(PROGRAM)}",
        ["class ModelNew"],
        ["class Model(nn.Module)"],
    ),
    (
        "kernel and class split over two blocks",
        f"Kernel:\n{fenced(KERNEL)}\nModule:\n{fenced(MODEL_NEW)}",
        ["@triton.jit", "class ModelNew", "import triton"],
        [],
    ),
    (
        "draft then a revised ModelNew that reuses the draft's kernel",
        f"{fenced(PROGRAM)}\nBetter launch config:\n{fenced(MODEL_NEW.replace('1024', '2048'))}",
        ["@triton.jit", "BLOCK=2048"],
        [],
    ),
    (
        "a CUDA source block is not Python",
        f"{fenced(CUDA_SNIPPET, info='cuda')}\n{fenced(PROGRAM)}",
        ["class ModelNew"],
        ["__global__"],
    ),
    ("unterminated final fence (cut at max tokens)", f"Sure.\n```python\n{PROGRAM}", ["class ModelNew"], []),
    (
        "unterminated fence with a half-written last line",
        f"```python\n{PROGRAM}\n\ndef helper(x):\n    return torch.relu(",
        ["class ModelNew"],
        ["def helper"],
    ),
    (
        "no fences: prose, then a plain program, then prose",
        f"Below is the code.\n\n{PROGRAM}\nThe kernel uses a mask for the tail.",
        ["class ModelNew", "relu_kernel"],
        ["Below is", "The kernel uses"],
    ),
    ("CRLF line endings", fenced(PROGRAM).replace("\n", "\r\n"), ["class ModelNew"], ["\r"]),
    (
        "indented fence inside a list item",
        "1. Code:\n" + "\n".join("   " + line for line in fenced(PROGRAM).splitlines()),
        ["class ModelNew"],
        [],
    ),
]


@pytest.mark.parametrize(("reply", "present", "absent"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_extracts_the_program(reply: str, present: list[str], absent: list[str]) -> None:
    code = extract_code(reply)
    assert code is not None
    tree = ast.parse(code)
    assert "ModelNew" in {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    for text in present:
        assert text in code
    for text in absent:
        assert text not in code


@pytest.mark.parametrize(
    "reply",
    [
        "I cannot write this kernel.",
        fenced(REFERENCE),  # no ModelNew anywhere
        "<think>The kernel should tile the matmul and",  # cut inside the reasoning
        "```python\nclass ModelNew(nn.Module:\n    def forward(self, x) return x\n```",  # broken syntax from the start
        "",
    ],
    ids=["refusal", "only the reference", "cut in reasoning", "syntax error", "empty"],
)
def test_nothing_usable_is_none(reply: str) -> None:
    assert extract_code(reply) is None


def test_required_names_are_configurable() -> None:
    """The Proposer's composer asks for a KernelBench module instead of a ModelNew."""
    module = REFERENCE + "\n\ndef get_inputs():\n    return [torch.randn(4, 4)]\n\n\ndef get_init_inputs():\n    return []\n"
    reply = f"Module:\n{fenced(module)}"
    assert extract_code(reply, ("Model", "get_inputs", "get_init_inputs")) == module
    assert extract_code(reply) is None
    inputs_apart = f"{fenced(REFERENCE)}\nand its inputs:\n{fenced(module[len(REFERENCE) :])}"
    joined = extract_code(inputs_apart, ("Model", "get_inputs", "get_init_inputs"))
    assert joined is not None and "class Model" in joined and "def get_init_inputs" in joined


def test_a_revision_overrides_the_draft() -> None:
    reply = f"{fenced(PROGRAM)}\nBetter launch config:\n{fenced(MODEL_NEW.replace('1024', '2048'))}"
    code = extract_code(reply)
    assert code is not None and code.rindex("BLOCK=2048") > code.rindex("BLOCK=1024")  # the last ModelNew wins at import


MODULE = REFERENCE + "\n\ndef get_inputs():\n    return [torch.randn(8, 8)]\n\n\ndef get_init_inputs():\n    return []\n"


@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_prompt_holds_the_module_the_example_and_the_rules(backend: str) -> None:
    system, user = kernel_messages(MODULE, backend)  # type: ignore[arg-type]
    assert system == {"role": "system", "content": SYSTEM_PROMPTS[backend]}  # type: ignore[index]
    assert user["role"] == "user"
    text = user["content"]
    assert MODULE.rstrip() in text and EXAMPLE_MODEL.rstrip() in text and EXAMPLES[backend].rstrip() in text  # type: ignore[index]
    assert text.index(EXAMPLE_MODEL.rstrip()) < text.index(MODULE.rstrip())  # example first, then the task
    for rule in ("same arguments as `Model.__init__`", "fall back to PyTorch", "No caching", "in place"):
        assert rule in text
    marker = "load_inline" if backend == "cuda" else "@triton.jit"
    assert marker in text
    # The worked example in the prompt is itself what extract_code pulls out of a model that echoes it.
    assert extract_code(f"```python\n{EXAMPLES[backend]}```") == EXAMPLES[backend]  # type: ignore[index]


def test_system_prompt_is_configurable_per_backend() -> None:
    settings = Settings(coder_system_prompt_cuda="CUDA only, please.")
    assert system_prompt_for("cuda", settings) == "CUDA only, please."
    assert system_prompt_for("triton", settings) == SYSTEM_PROMPTS["triton"]
    assert kernel_messages(MODULE, "cuda", system_prompt_for("cuda", settings))[0]["content"] == "CUDA only, please."
    with pytest.raises(ValueError, match="unknown kernel backend"):
        kernel_messages(MODULE, "opencl")  # type: ignore[arg-type]


@pytest.mark.slow
def test_worked_triton_example_is_correct_under_the_reward_service(evaluator: Evaluator) -> None:
    """A prompt that teaches a kernel the reward service rejects would teach the wrong thing."""
    reference = EXAMPLE_MODEL.replace("4096, 1024", "8, 256")  # small: the Triton interpreter runs it on CPU
    [verdict] = evaluator.evaluate_group(
        reference, [EXAMPLES["triton"]], ScoreOptions(backend="triton", device="cpu", timeout_s=120)
    ).verdicts
    assert verdict.correct, verdict.reason
