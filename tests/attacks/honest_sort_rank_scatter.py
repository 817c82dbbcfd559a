import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def rank_kernel(x_ptr, rank_ptr, C, BLOCK: tl.constexpr):
    """Rank of every element in its row (ties broken by position): a counting sort's first pass."""
    row = tl.program_id(0)
    i = tl.arange(0, BLOCK)
    mask = i < C
    x = tl.load(x_ptr + row * C + i, mask=mask, other=float("inf"))
    xi = x[:, None]
    xj = x[None, :]
    before = (xj < xi) | ((xj == xi) & (i[None, :] < i[:, None]))
    tl.store(rank_ptr + row * C + i, tl.sum(before.to(tl.int64), 1), mask=mask)


class ModelNew(nn.Module):
    """Ranks in Triton; the values placed at their ranks by a PyTorch scatter (glue)."""

    def forward(self, x):
        x = x.contiguous()
        R, C = x.shape
        ranks = torch.empty((R, C), dtype=torch.int64, device=x.device)
        rank_kernel[(R,)](x, ranks, C, BLOCK=triton.next_power_of_2(C))
        return torch.empty_like(x).scatter_(1, ranks, x)
