"""The LLM composer: a chat model writes a KernelBench-format module from an API set.

The prompt gives the API set, the format with a worked example and the rules the validation check
will apply; the reply's program is extracted with the Coder's extractor and must parse and have
the KernelBench structure. The APIs recorded are those the program really uses (mined from its
``forward``), which may differ from the ones asked for.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass

from proposer_svc.compose.base import ProposalHints, ProposedModule
from proposer_svc.mining import forward_api_sets
from proposer_svc.validate import check_structure
from services.llm.chat import ChatModel, Completion, Message, Sampling
from services.llm.extract import extract_code
from services.outcomes import Declined

REQUIRED_NAMES = ("Model", "get_inputs", "get_init_inputs")

SYSTEM_PROMPT = """You write PyTorch modules that serve as GPU-kernel optimisation tasks, in the KernelBench format.
A task is one Python file with:
- `class Model(nn.Module)`: `__init__` takes the constructor arguments (if any), `forward` computes the output;
- module-level size constants (batch size, channels, features...);
- `get_inputs()`: a list of input tensors for `forward`, built with torch.randn/torch.rand/torch.randint;
- `get_init_inputs()`: the list of arguments for `Model(...)`.
The output must be finite (no NaN/Inf: keep log/sqrt/division inputs positive), must depend on every input
and every parameter, and must not be (near-)constant. Use no randomness inside forward (no dropout), no
file or network access, and sizes such that one forward pass takes between 0.1 and 50 ms on a GPU.
Reply with the complete file in one ```python block."""

EXAMPLE = '''import torch
import torch.nn as nn


class Model(nn.Module):
    """Convolution, ReLU, then a learned per-channel bias."""

    def __init__(self, in_channels, out_channels, kernel_size, bias_shape):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        x = self.conv(x)
        x = torch.relu(x)
        x = x + self.bias
        return x


batch_size = 128
in_channels = 3
out_channels = 16
height = width = 32
kernel_size = 3
bias_shape = (out_channels, 1, 1)


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, bias_shape]
'''


def build_messages(api_set: Sequence[str], hints: ProposalHints) -> list[Message]:
    size = "small, simple" if hints.difficulty < 0.34 else "medium" if hints.difficulty < 0.67 else "larger, longer"
    apis = "\n".join(f"- {api}" for api in api_set)
    user = (
        f"Here is an example task:\n```python\n{EXAMPLE}```\n\n"
        f"Write a new task whose forward uses these Torch APIs (chain and combine them so every one matters; "
        f"`Tensor.<m>` means the tensor method `x.<m>(...)`):\n{apis}\n\n"
        f"Use at most {hints.max_ops} operations in forward; make it {size} (difficulty {hints.difficulty:.2f})."
    )
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


@dataclass(frozen=True)
class SampledModule:
    """One reply of a group: the module it holds, or why it holds none (``declined``)."""

    completion: Completion
    module: ProposedModule | None
    declined: str | None


class LLMComposer:
    name = "llm"

    def __init__(self, model: ChatModel, sampling: Sampling | None = None) -> None:
        self.model = model
        self.sampling = sampling or Sampling(n=1, temperature=0.8, max_tokens=2048)

    def compose(self, api_set: Sequence[str], hints: ProposalHints) -> ProposedModule:
        sampling = self.sampling.model_copy(update={"n": 1, "seed": hints.seed if hints.seed is not None else self.sampling.seed})
        completions = self.model.complete(build_messages(api_set, hints), sampling)
        if not completions:
            raise Declined("the model returned no reply")
        return module_from_reply(completions[0], api_set)

    def sample_group(
        self, api_set: Sequence[str], hints: ProposalHints, sampling: Sampling
    ) -> tuple[list[Message], list[SampledModule]]:
        """``sampling.n`` replies to one API set's prompt, each kept as drawn (a Proposer RL group): the
        prompt, and per reply its module or the reason it holds none."""
        messages = build_messages(api_set, hints)
        group = []
        for completion in self.model.complete(messages, sampling.model_copy(update={"seed": hints.seed})):
            try:
                group.append(SampledModule(completion, module_from_reply(completion, api_set), None))
            except Declined as exc:
                group.append(SampledModule(completion, None, str(exc)))
        return messages, group


def module_from_reply(reply: Completion, api_set: Sequence[str]) -> ProposedModule:
    """The KernelBench-format module in a reply, with the APIs its ``forward`` really uses; ``Declined``
    with the reason where it holds none."""
    source = extract_code(reply.text, REQUIRED_NAMES)
    if source is None:
        cut = " (the reply was cut at max_tokens)" if reply.finish_reason == "length" else ""
        raise Declined(f"no program defining {', '.join(REQUIRED_NAMES)} in the reply{cut}")
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise Declined(f"the program does not parse: {exc.msg}") from exc
    problem = check_structure(tree)
    if problem:
        raise Declined(problem)
    used = sorted(set().union(*forward_api_sets(tree)))
    return ProposedModule(
        source=source,
        api_set=used,
        input_shapes=[],  # known once validation has run the module
        origin=f"llm:{reply.model}",
        details={
            "requested": list(api_set),
            "missing": sorted(set(api_set) - set(used)),
            "model_version": reply.model_version,
            "finish_reason": reply.finish_reason,
        },
    )
