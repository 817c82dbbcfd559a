import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def softmax_kernel(x_ptr, m_ptr, out_ptr, C, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < C
    x = tl.load(x_ptr + row * C + cols, mask=mask, other=-float("inf"))
    e = tl.exp(x - tl.load(m_ptr + row))
    tl.store(out_ptr + row * C + cols, e / tl.sum(e, 0), mask=mask)


class ModelNew(nn.Module):
    """Row maxima by PyTorch (glue), exp, sum and division in Triton."""

    def forward(self, x):
        x = x.contiguous()
        m = torch.amax(x, dim=1)
        out = torch.empty_like(x)
        softmax_kernel[(x.shape[0],)](x, m, out, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
        return out
