import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def dist_epilogue_kernel(xy_ptr, x_ptr, y_ptr, out_ptr, N, D: tl.constexpr, BLOCK_N: tl.constexpr):
    """Row i: sqrt(|x_i|^2 + |y_j|^2 - 2 x_i.y_j) for every j, the norms computed here."""
    i = tl.program_id(0)
    d = tl.arange(0, D)
    j = tl.arange(0, BLOCK_N)
    mask = j < N
    xi = tl.load(x_ptr + i * D + d)
    yj = tl.load(y_ptr + j[:, None] * D + d[None, :], mask=mask[:, None], other=0.0)
    xx = tl.sum(xi * xi, 0)
    yy = tl.sum(yj * yj, 1)
    xy = tl.load(xy_ptr + i * N + j, mask=mask, other=0.0)
    tl.store(out_ptr + i * N + j, tl.sqrt(tl.maximum(xx + yy - 2.0 * xy, 0.0)), mask=mask)


class ModelNew(nn.Module):
    """The usual cdist: the inner products by cuBLAS (PyTorch), norms and square root in a Triton epilogue."""

    def forward(self, x, y):
        M, D = x.shape
        N = y.shape[0]
        xy = torch.mm(x, y.t())
        out = torch.empty((M, N), dtype=x.dtype, device=x.device)
        dist_epilogue_kernel[(M,)](xy, x.contiguous(), y.contiguous(), out, N, D=D, BLOCK_N=triton.next_power_of_2(N))
        return out
