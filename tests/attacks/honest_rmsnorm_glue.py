import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def scale_kernel(x_ptr, inv_ptr, out_ptr, n, CHW, HW, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    inv = tl.load(inv_ptr + (offs // CHW) * HW + offs % HW, mask=mask)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * inv, mask=mask)


class ModelNew(nn.Module):
    """The inverse RMS over channels by PyTorch (glue), the scaling in Triton."""

    def forward(self, x):
        x = x.contiguous()
        N, C, H, W = x.shape
        inv = torch.rsqrt(torch.mean(x * x, dim=1) + 1e-5).contiguous()  # (N, H, W)
        out = torch.empty_like(x)
        scale_kernel[(triton.cdiv(x.numel(), 1024),)](x, inv, out, x.numel(), C * H * W, H * W, BLOCK=1024)
        return out
