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
    """The masking by PyTorch (glue), the scan in Triton."""

    def forward(self, x, mask):
        masked = (x * mask).contiguous()
        out = torch.empty_like(masked)
        row_cumsum_kernel[(x.shape[0],)](masked, out, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
        return out
