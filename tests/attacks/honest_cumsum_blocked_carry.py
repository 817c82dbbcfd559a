import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def block_scan_kernel(x_ptr, out_ptr, totals_ptr, C, NB, BLOCK: tl.constexpr):
    """Phase 1 of a blocked scan: each block's inclusive scan, and its total."""
    row = tl.program_id(0)
    blk = tl.program_id(1)
    cols = blk * BLOCK + tl.arange(0, BLOCK)
    mask = cols < C
    x = tl.load(x_ptr + row * C + cols, mask=mask, other=0.0)
    s = tl.cumsum(x, 0)
    tl.store(out_ptr + row * C + cols, s, mask=mask)
    tl.store(totals_ptr + row * NB + blk, tl.sum(x, 0))


class ModelNew(nn.Module):
    """A three-phase scan: block scans in Triton, the carries (a scan of block totals) and their
    addition as PyTorch bookkeeping."""

    BLOCK = 64

    def forward(self, x):
        x = x.contiguous()
        R, C = x.shape
        nb = triton.cdiv(C, self.BLOCK)
        out = torch.empty_like(x)
        totals = torch.empty((R, nb), dtype=x.dtype, device=x.device)
        block_scan_kernel[(R, nb)](x, out, totals, C, nb, BLOCK=self.BLOCK)
        carry = torch.cumsum(totals, dim=1) - totals
        return out + carry.repeat_interleave(self.BLOCK, dim=1)[:, :C]
