import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def row_argmax_kernel(x_ptr, out_ptr, C, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * C + cols, mask=cols < C, other=-float("inf"))
    tl.store(out_ptr + row, tl.argmax(x, 0).to(tl.int64))


class ModelNew(nn.Module):
    """argmin(x) = argmax(-x): one Triton argmax kernel, the negation as PyTorch glue."""

    def forward(self, x):
        R, C = x.shape
        out = torch.empty(R, dtype=torch.int64, device=x.device)
        row_argmax_kernel[(R,)]((-x).contiguous(), out, C, BLOCK=triton.next_power_of_2(C))
        return out
