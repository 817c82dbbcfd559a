import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def normalize_kernel(x_ptr, mean_ptr, rstd_ptr, w_ptr, b_ptr, out_ptr, C, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < C
    x = tl.load(x_ptr + row * C + cols, mask=mask)
    y = (x - tl.load(mean_ptr + row)) * tl.load(rstd_ptr + row)
    tl.store(out_ptr + row * C + cols, y * tl.load(w_ptr + cols, mask=mask) + tl.load(b_ptr + cols, mask=mask), mask=mask)


class ModelNew(nn.Module):
    """Statistics by torch.var_mean (glue), normalisation and affine in Triton."""

    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(128)

    def forward(self, x):
        x = x.contiguous()
        var, mean = torch.var_mean(x, dim=1, unbiased=False)
        rstd = torch.rsqrt(var + self.ln.eps)
        out = torch.empty_like(x)
        normalize_kernel[(x.shape[0],)](x, mean, rstd, self.ln.weight, self.ln.bias, out, x.shape[1], BLOCK=128)
        return out
