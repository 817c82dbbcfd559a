import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def affine_kernel(x_ptr, ch_ptr, scale_ptr, shift_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    ch = tl.load(ch_ptr + offs, mask=mask, other=0)
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x * tl.load(scale_ptr + ch, mask=mask) + tl.load(shift_ptr + ch, mask=mask), mask=mask)


class ModelNew(nn.Module):
    """The channel of every element precomputed by PyTorch (index glue), the affine in Triton."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(8))
        self.shift = nn.Parameter(torch.randn(8))

    def forward(self, x):
        x = x.contiguous()
        N, C, H, W = x.shape
        ch = (torch.arange(x.numel(), device=x.device) // (H * W)) % C
        out = torch.empty_like(x)
        affine_kernel[(triton.cdiv(x.numel(), 1024),)](x, ch, self.scale, self.shift, out, x.numel(), BLOCK=1024)
        return out
