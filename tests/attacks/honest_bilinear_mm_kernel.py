import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def second_contraction_kernel(t_ptr, b_ptr, bias_ptr, out_ptr, O: tl.constexpr, J: tl.constexpr, BLOCK_J: tl.constexpr):
    """out[n, o] = sum_j t[n, o, j] * b[n, j] + bias[o]."""
    n = tl.program_id(0)
    o = tl.arange(0, O)
    j = tl.arange(0, BLOCK_J)
    jm = j < J
    t = tl.load(t_ptr + n * O * J + o[:, None] * J + j[None, :], mask=jm[None, :], other=0.0)
    b = tl.load(b_ptr + n * J + j, mask=jm, other=0.0)
    tl.store(out_ptr + n * O + o, tl.sum(t * b[None, :], 1) + tl.load(bias_ptr + o))


class ModelNew(nn.Module):
    """Bilinear as two contractions: a @ W by cuBLAS (PyTorch), then the contraction with b and the bias in Triton."""

    def __init__(self):
        super().__init__()
        self.bil = nn.Bilinear(24, 20, 8)

    def forward(self, a, b):
        w = self.bil.weight  # (O, I, J)
        O, I, J = w.shape
        t = torch.mm(a, w.permute(1, 0, 2).reshape(I, O * J))  # (N, O*J)
        out = torch.empty((a.shape[0], O), dtype=a.dtype, device=a.device)
        second_contraction_kernel[(a.shape[0],)](
            t, b.contiguous(), self.bil.bias, out, O=O, J=J, BLOCK_J=triton.next_power_of_2(J)
        )
        return out
