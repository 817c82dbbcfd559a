"""The conditions every judged call of a candidate runs under (trials, replays, knockouts, warm-ups).

Uninitialised memory is filled with NaN (PyTorch's ``fill_uninitialized_memory``), so an output that
was never written, or a ``torch.empty`` that would hand back a block holding an earlier answer, is
wrong rather than right by luck. PyTorch fills only while deterministic algorithms are on, and that
switch also restricts cuDNN to its deterministic algorithms: for some convolutions that is one
forty times slower (a ConvTranspose3d's dgrad: 1.3 s a call for 33 ms; measured in
``benchmarks/results/reward_throughput_h200/NOTES.md``), paid by every trial under the device hold.
So convolutions, which write the whole of what they allocate, run with the switch off and choose
their algorithm as the reference's and the timed calls do; everything else keeps it on.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# Ops that read the deterministic switch only to choose an algorithm and write every element of the
# tensors they allocate (the filling would be overwritten anyway), by overload packet. ``convolution``
# is where conv1d/2d/3d and the transposed ones arrive decomposed; under ``torch.inference_mode`` or
# inside a custom op's body they arrive whole, and their C++ decomposition runs inside the window.
ALGORITHM_CHOICE_OPS = frozenset(
    {
        torch.ops.aten.convolution,
        torch.ops.aten._convolution_mode,
        torch.ops.aten.conv1d,
        torch.ops.aten.conv2d,
        torch.ops.aten.conv3d,
        torch.ops.aten.conv_transpose1d,
        torch.ops.aten.conv_transpose2d,
        torch.ops.aten.conv_transpose3d,
        torch.ops.aten.cudnn_convolution_relu,
        torch.ops.aten.cudnn_convolution_add_relu,
    }
)


PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


class ConvolutionsChooseFreely(TorchDispatchMode):
    """Runs ``ALGORITHM_CHOICE_OPS`` on plain tensors with deterministic algorithms off; every other op,
    and one given a tensor subclass (whose own ``__torch_dispatch__`` would run Python with the fill
    off), as it comes."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """As ``OpRecorder``: not torch's wrapping of ``__torch_dispatch__`` (it loads Dynamo at the first op)."""
        return False

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func.overloadpacket not in ALGORITHM_CHOICE_OPS or not all(t in PLAIN_TENSORS for t in types):
            return func(*args, **(kwargs or {}))
        previous = torch.are_deterministic_algorithms_enabled()
        use_deterministic_algorithms(False)
        try:
            return func(*args, **(kwargs or {}))
        finally:
            use_deterministic_algorithms(previous)


@contextlib.contextmanager
def judged_conditions() -> Iterator[None]:
    """What every judged call runs under, trials and replays alike: uninitialised memory filled with
    NaN, deterministic algorithms but for convolutions' (``ConvolutionsChooseFreely``). The same for
    all, so a forward cannot tell the replays from the trials (a NaN-filled ``torch.empty`` would
    have told it)."""
    import torch.utils.deterministic as deterministic

    # fill_uninitialized_memory is documented torch API that torch's type stubs leave out
    previous = (torch.are_deterministic_algorithms_enabled(), deterministic.fill_uninitialized_memory)  # type: ignore[attr-defined]
    use_deterministic_algorithms(True)
    deterministic.fill_uninitialized_memory = True  # type: ignore[attr-defined]
    try:
        with ConvolutionsChooseFreely():
            yield
    finally:
        use_deterministic_algorithms(previous[0])
        deterministic.fill_uninitialized_memory = previous[1]  # type: ignore[attr-defined]


def use_deterministic_algorithms(mode: bool) -> None:
    """``torch.use_deterministic_algorithms(mode, warn_only=True)`` without loading Inductor for it
    (torch's function imports ``torch._inductor.config`` to set its ``deterministic``, and with it
    Dynamo: most of a child's warm-up). Inductor's flag is set where Inductor is loaded; where it is
    not, nothing a candidate may call compiles with it (the policy refuses ``torch.compile`` and
    Dynamo). Nothing else changes: a state the forward could read (the environment Inductor's
    config reads when it loads, for one) would tell the judged calls from the timed ones."""
    if "torch._inductor.config" in sys.modules:
        torch.use_deterministic_algorithms(mode, warn_only=True)
    else:
        torch._C._set_deterministic_algorithms(mode, warn_only=True)
