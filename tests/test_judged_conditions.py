"""The judged calls' conditions: uninitialised memory NaN everywhere, deterministic algorithms everywhere
but inside convolutions (whose cuDNN choice under them can be forty times slower)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
import torch.utils.deterministic as deterministic
from torch.utils._python_dispatch import TorchDispatchMode

from reward_svc.harness.judged import judged_conditions


class DeterminismProbe(TorchDispatchMode):
    """Beneath the judged conditions' mode: whether deterministic algorithms were on as each op ran."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, set[bool]] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.seen.setdefault(func.overloadpacket.__name__, set()).add(torch.are_deterministic_algorithms_enabled())
        return func(*args, **(kwargs or {}))


def test_uninitialised_memory_is_nan_and_convolutions_alone_choose_their_algorithms() -> None:
    x = torch.randn(2, 4, 5, 6, 6)
    weight = torch.randn(4, 3, 3, 3, 3)
    expected = F.conv_transpose3d(x, weight, stride=2, padding=1).clamp(min=-1.0) / 2
    before = (torch.are_deterministic_algorithms_enabled(), deterministic.fill_uninitialized_memory)  # type: ignore[attr-defined]
    probe = DeterminismProbe()
    with torch.no_grad(), probe, judged_conditions():
        empty = torch.empty(64)
        empty_ints = torch.empty(64, dtype=torch.int32)
        out = F.conv_transpose3d(x, weight, stride=2, padding=1).clamp(min=-1.0) / 2
        conv2d = F.conv2d(x[:, :, 0], torch.randn(2, 4, 3, 3))
        after_conv = torch.empty_like(out)
    assert torch.isnan(empty).all() and torch.isnan(after_conv).all()
    assert (empty_ints == torch.iinfo(torch.int32).max).all()
    assert probe.seen["convolution"] == {False}, "a convolution chooses its algorithm as the reference's does"
    assert probe.seen["clamp"] == probe.seen["div"] == probe.seen["empty"] == {True}
    torch.testing.assert_close(out, expected)
    assert conv2d.shape == (2, 2, 4, 4) and torch.isfinite(conv2d).all()
    assert (torch.are_deterministic_algorithms_enabled(), deterministic.fill_uninitialized_memory) == before  # type: ignore[attr-defined]
    assert torch.isfinite(torch.zeros(8)).all()


def test_a_convolution_under_inference_mode_chooses_its_algorithm_too() -> None:
    """Under inference mode (or in a custom op's body) conv2d reaches the modes whole, not as ``convolution``."""
    probe = DeterminismProbe()
    with torch.inference_mode(), probe, judged_conditions():
        out = F.conv_transpose2d(torch.randn(1, 3, 5, 5), torch.randn(3, 2, 3, 3), stride=2)
        padded = F.conv2d(torch.randn(1, 3, 5, 5), torch.randn(2, 3, 3, 3), padding="same")
        assert torch.isnan(torch.empty(8)).all()
    assert out.shape == (1, 2, 11, 11) and padded.shape == (1, 2, 5, 5)
    assert probe.seen["conv_transpose2d"] == probe.seen["conv2d"] == {False}
    assert probe.seen["empty"] == {True}


def test_a_convolution_that_raises_leaves_the_judged_conditions_as_they_were() -> None:
    probe = DeterminismProbe()
    with torch.no_grad(), probe, judged_conditions():
        try:
            F.conv2d(torch.randn(1, 3, 4, 4), torch.randn(2, 5, 3, 3))  # 5 input channels for 3
        except RuntimeError:
            pass
        else:
            raise AssertionError("mismatched channels must raise")
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.isnan(torch.empty(16)).all()
    assert probe.seen["convolution"] == {False}


class Sneaky(torch.Tensor):
    """A subclass whose dispatch runs Python inside the convolution: it must not run with the fill off."""

    fills_seen: list[bool] = []

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        cls.fills_seen.append(bool(torch.isnan(torch.empty(4)).all()))
        return torch._C._disabled_torch_dispatch_impl(func, types, args, kwargs or {})


def test_a_tensor_subclass_in_a_convolution_runs_with_the_fill_on() -> None:
    x = torch.randn(1, 3, 4, 4).as_subclass(Sneaky)
    with torch.no_grad(), judged_conditions():
        F.conv2d(x, torch.randn(2, 3, 3, 3))
    assert Sneaky.fills_seen and all(Sneaky.fills_seen)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_on_the_gpu_a_judged_convolution_gets_the_reference_answer_and_memory_is_still_nan() -> None:
    torch.manual_seed(0)
    conv = torch.nn.ConvTranspose3d(16, 32, 3, stride=2, padding=1).cuda()
    x = torch.rand(4, 16, 12, 24, 24, device="cuda")
    with torch.no_grad():
        expected = conv(x).clamp(min=-1.0) / 2
        probe = DeterminismProbe()
        with probe, judged_conditions():
            out = conv(x).clamp(min=-1.0) / 2
            empty = torch.empty(1 << 20, device="cuda")
    assert probe.seen["convolution"] == {False}
    assert torch.isnan(empty).all()
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)
