"""The check call after timing must look, to the forward, like the timed calls it stands for.

``_call_as_timed`` is the only evidence of what forward does while it is timed: it runs under the timed
calls' conditions, so a forward telling timed from judged calls shows its timed behaviour there. The
timed calls run with no dispatch mode and the check call under an ``OpRecorder``; until 2026-12-05 the
recorder kept the outputs of data-free factories (``torch.zeros``) alive, so a second ``torch.zeros``
of the same size got the freed block's address in a timed call only (found by an attack). A forward
comparing ``data_ptr()``s (the policy allows it) could compute honestly in every recorded call and
skip its work while timed. The recorder now keeps no memory alive; other differences it makes (its
host time per op, the allocator's statistics) are in REWARD.md's "What the guards cannot see".
"""

from __future__ import annotations

import weakref
from pathlib import Path

import pytest
import torch

from reward_cases import RELU_REFERENCE, candidate
from reward_svc.policy import check_source

# Passes the static policy: data_ptr() is allowed (cache_by_address uses it).
TELLS_THE_CHECK_CALL_FROM_THE_TIMED_ONES = candidate(
    "a = torch.zeros(256, device=x.device)\np = a.data_ptr()\ndel a\n"
    "if torch.zeros(256, device=x.device).data_ptr() == p:\n"
    "    return launch_relu(x[:1], torch.empty_like(x))  # not recorded: a timed call, no work done\n"
    "return launch_relu(x, torch.empty_like(x))"
)


class Peeks(torch.nn.Module):
    """The same test in plain PyTorch: 1.0 where the forward believes it is being timed, else 0.0."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.zeros(256, device=x.device)
        p = a.data_ptr()
        del a
        timed = torch.zeros(256, device=x.device).data_ptr() == p
        return torch.full_like(x, float(timed))


def test_the_allocator_probe_passes_the_policy() -> None:
    assert "relu" in RELU_REFERENCE
    assert check_source(TELLS_THE_CHECK_CALL_FROM_THE_TIMED_ONES) == []


def test_the_recorder_keeps_none_of_the_forwards_tensors_alive() -> None:
    """The mechanism, on any host: a tensor forward lets go of is freed there and then, recorded or not
    (the host allocator's reuse also follows Python's own allocations, so on the CPU addresses alone
    would not say it)."""
    from services.children.ops import OpRecorder

    freed_at_once: list[bool] = []

    def forward(x: torch.Tensor) -> torch.Tensor:
        scratch = torch.zeros(256)  # data-free: the recorder follows it
        storage = weakref.ref(scratch.untyped_storage())
        del scratch
        freed_at_once.append(storage() is None)
        return x * 2

    with torch.no_grad(), OpRecorder():
        forward(torch.randn(8))
    assert freed_at_once == [True]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_the_check_call_cannot_be_told_from_a_timed_call() -> None:
    """Where the attack aims: the caching allocator, which only tensors move."""
    from reward_svc.harness.candidate import TrialOutputs, _call_as_timed
    from reward_svc.harness.instrument import LaunchCounter

    model, x = Peeks(), torch.randn(64, device="cuda")
    with torch.no_grad():
        timed = model(x)  # as ``_time_candidate``'s timed_call runs it: no mode, no judged conditions
        checked, _ = _call_as_timed(model, (x,), LaunchCounter(), TrialOutputs(Path("unused"), key=7), case=1)
    assert torch.equal(timed, checked), (
        "forward told the check call (recorded) from a timed call (not recorded) by where the allocator put a "
        "torch.zeros: what it does while timed is unchecked"
    )
