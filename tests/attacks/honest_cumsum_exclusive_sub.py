import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def row_cumsum_kernel(x_ptr, out_ptr, C, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < C
    x = tl.load(x_ptr + row * C + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row * C + cols, tl.cumsum(x, 0), mask=mask)


class ModelNew(nn.Module):
    """Inclusive scan in Triton; exclusive = inclusive - x (one PyTorch subtraction)."""

    def forward(self, x):
        x = x.contiguous()
        R, C = x.shape
        inclusive = torch.empty_like(x)
        row_cumsum_kernel[(R,)](x, inclusive, C, BLOCK=triton.next_power_of_2(C))
        return inclusive - x
